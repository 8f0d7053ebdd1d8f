"""QA data: the example schema, dataset loaders, splits and answer normalisation."""

from kgreasoner.data.datasets import Dataset, load_dataset, load_datasets, open_dataset_kg
from kgreasoner.data.normalize import normalize_answer
from kgreasoner.data.pathquestion import PATHQUESTION_SETS, load_pathquestion, parse_pathquestion_line
from kgreasoner.data.paths import DATA_ENV, find_data_dir
from kgreasoner.data.schema import Answer, QAExample, SchemaError, TopicEntity, read_jsonl, write_jsonl
from kgreasoner.data.splits import SCHEMES, SplitOverlap, assign_splits, group_key, overlap_stats
from kgreasoner.data.tog_json import TOG_FORMATS, load_tog_json, parse_tog_record

__all__ = [
    "Answer",
    "DATA_ENV",
    "Dataset",
    "PATHQUESTION_SETS",
    "QAExample",
    "SCHEMES",
    "SchemaError",
    "SplitOverlap",
    "TOG_FORMATS",
    "TopicEntity",
    "assign_splits",
    "find_data_dir",
    "group_key",
    "load_dataset",
    "load_datasets",
    "load_pathquestion",
    "load_tog_json",
    "normalize_answer",
    "open_dataset_kg",
    "overlap_stats",
    "parse_pathquestion_line",
    "parse_tog_record",
    "read_jsonl",
    "write_jsonl",
]
