"""Measuring the machine while ranks run.

monitor.py   the sampler thread of the launching process: host, rank and GPU samples into
             RUN_DIR/system.jsonl
"""
