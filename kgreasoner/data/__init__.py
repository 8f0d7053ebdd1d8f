"""QA datasets over their knowledge graphs: loading a dataset with its KB, searching relation paths, preparing
a published set. The records themselves (the example schema, splits, the format readers) are `kgreasoner.records`.
The exports are imported on first use (`kgreasoner.lazy`): importing the package loads no KG store."""

from typing import TYPE_CHECKING

from kgreasoner.lazy import exports

if TYPE_CHECKING:
    from kgreasoner.data.datasets import Dataset, load_dataset, load_datasets, open_dataset_kg
else:
    __getattr__ = exports(
        __name__,
        {
            "Dataset": "kgreasoner.data.datasets",
            "load_dataset": "kgreasoner.data.datasets",
            "load_datasets": "kgreasoner.data.datasets",
            "open_dataset_kg": "kgreasoner.data.datasets",
        },
    )

__all__ = [
    "Dataset",
    "load_dataset",
    "load_datasets",
    "open_dataset_kg",
]
