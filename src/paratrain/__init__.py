"""paratrain: train PyTorch models in parallel and measure whether the parallelism pays off."""
from paratrain.config import TrainConfig
from paratrain.errors import UsageError
from paratrain.launch import train

__all__ = ["TrainConfig", "UsageError", "train"]
__version__ = "0.1.0"
