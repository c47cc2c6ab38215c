"""Named validation matrices: ci and dist-ci (CPU, run by CI), gpu-quick and gpu-full (CUDA).

A matrix is data: validate/matrices/matrices.json lists the topics it joins, and each topic's
rows are a JSON file in validate/matrices/rows/ (validate.matrices.load reads them). The tolerance
each topic's rows are held to is one table, validate.matrices.tolerances. The pairwise designs
that chose many rows (validate.matrices.pairwise) are kept for designing new rows; the rows
themselves are written out, so a recorded result's name always means the same configuration.
"""
from __future__ import annotations

from validate.matrices.load import MATRICES, get_matrix, read_topic, topic_cases

__all__ = ["MATRICES", "get_matrix", "read_topic", "topic_cases"]
