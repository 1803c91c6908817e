"""Data for every model family: text corpora, language-model token streams, parallel pairs, labelled text and
synthetic tasks. Sits beside the model stack and never imports it.
"""

from attnkit.data.batching import IGNORE_INDEX, BucketedData, pad
from attnkit.data.corpus import find_files, resolve_files, stdlib_files
from attnkit.data.labelled import LabelledBatch, LabelledData, LabelVocab, read_labelled
from attnkit.data.lm import LMData, token_dtype
from attnkit.data.pairs import PairBatch, PairData, read_parallel, read_tsv_pairs
from attnkit.data.synthetic import TASKS, Example, SyntheticTask, make_task, synthetic_tokenizer
from attnkit.textfiles import read_lines, read_text

__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "BucketedData",
    "Example",
    "LMData",
    "LabelVocab",
    "LabelledBatch",
    "LabelledData",
    "PairBatch",
    "PairData",
    "SyntheticTask",
    "find_files",
    "make_task",
    "pad",
    "read_labelled",
    "read_lines",
    "read_parallel",
    "read_text",
    "read_tsv_pairs",
    "resolve_files",
    "stdlib_files",
    "synthetic_tokenizer",
    "token_dtype",
]
