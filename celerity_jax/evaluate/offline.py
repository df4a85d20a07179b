"""Imported before `datasets` and lm-evaluation-harness: they then read local files only, nothing is downloaded."""

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
