"""azureml.data.data_reference.DataReference: a path on a datastore that a job reads.

On batchyard's local datastore every node reads the datastore's directory directly, so
``as_mount()`` and ``as_download()`` both give that path: in ``script_params``/``arguments``
the reference becomes the absolute path, and the job gets
``$AZUREML_DATAREFERENCE_<name>`` and ``$BATCHYARD_INPUT_<name>`` set to it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


class DataReference:
    def __init__(self, datastore: Any, data_reference_name: str | None = None,
                 path_on_datastore: str | None = None, mode: str = "mount",
                 path_on_compute: str | None = None, overwrite: bool = False) -> None:
        self.datastore = datastore
        self.data_reference_name = re.sub(r"\W", "_", data_reference_name or datastore.name)
        self.path_on_datastore = path_on_datastore
        self.mode = mode
        self.path_on_compute = path_on_compute
        self.overwrite = overwrite

    @property
    def local_path(self) -> str:
        root = Path(self.datastore.root)
        return str(root / self.path_on_datastore if self.path_on_datastore else root)

    def __str__(self) -> str:
        return self.local_path

    def __repr__(self) -> str:
        return (f"DataReference(datastore={self.datastore.name}, path={self.path_on_datastore},"
                f" mode={self.mode})")

    def path(self, path: str | None = None, data_reference_name: str | None = None
             ) -> DataReference:
        return DataReference(self.datastore, data_reference_name, path, self.mode)

    def as_mount(self) -> DataReference:
        return DataReference(self.datastore, self.data_reference_name, self.path_on_datastore,
                             "mount")

    def as_download(self, path_on_compute: str | None = None,
                    overwrite: bool = False) -> DataReference:
        return DataReference(self.datastore, self.data_reference_name, self.path_on_datastore,
                             "download", path_on_compute, overwrite)

    def as_upload(self, path_on_compute: str | None = None,
                  overwrite: bool = False) -> DataReference:
        from batchyard.compat.azureml.exceptions import UnsupportedParameterError

        raise UnsupportedParameterError("as_upload", "write outputs to ./outputs (kept with the "
                                        "run) instead", "DataReference")


__all__ = ["DataReference"]
