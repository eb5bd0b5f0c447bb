"""Lake's protocol core: names, models, errors, the FILE type and wire helpers."""

from lake_core.errors import LakeError
from lake_core.filetype import FILE_STRUCT, file_field, is_file_field
from lake_core.ids import new_operation_id
from lake_core.models import CatalogEntry, DataLocation, TableDescriptor
from lake_core.names import TableRef
from lake_core.principal import DEV_PRINCIPAL, Principal

__all__ = [
    "DEV_PRINCIPAL",
    "FILE_STRUCT",
    "CatalogEntry",
    "DataLocation",
    "LakeError",
    "Principal",
    "TableDescriptor",
    "TableRef",
    "file_field",
    "is_file_field",
    "new_operation_id",
]
