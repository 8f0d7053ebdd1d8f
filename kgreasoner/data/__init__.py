"""QA datasets over their knowledge graphs: loading a dataset with its KB, searching relation paths, preparing
a published set. The records themselves (the example schema, splits, the format readers) are `kgreasoner.records`."""

from kgreasoner.data.datasets import Dataset, load_dataset, load_datasets, open_dataset_kg

__all__ = ["Dataset", "load_dataset", "load_datasets", "open_dataset_kg"]
