"""Every field of ``ModelConfig`` is acted on, refused or warned about (kserve_v2/repository/config_fields.py).

The walk runs in a subprocess: it imports the server's generated ``inference.*`` modules, which
cannot share a process with tritonclient's (tests/static/test_protos.py imports those).
"""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import ROOT

WALK = """
import json
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.repository.config_fields import ACTED, REFUSED, WARNED

paths = []
def walk(descriptor, prefix, seen):
    for field in descriptor.fields:
        path = prefix + field.name
        paths.append(path)
        held = field.message_type
        if held is not None and held.GetOptions().map_entry:
            held = held.fields_by_name["value"].message_type
        if held is not None and held.full_name not in seen:
            walk(held, path + ".", seen | {held.full_name})
walk(mc.ModelConfig.DESCRIPTOR, "", {mc.ModelConfig.DESCRIPTOR.full_name})
print(json.dumps({"paths": paths, "acted": list(ACTED), "refused": list(REFUSED), "warned": list(WARNED)}))
"""


def _tables() -> dict[str, list[str]]:
    done = subprocess.run([sys.executable, "-c", WALK], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=True)
    tables: dict[str, list[str]] = json.loads(done.stdout)
    return tables


TABLES = _tables()


def _covered(path: str) -> bool:
    """In a table, or under a refused or warned message (refused or warned as a whole)."""
    parts = path.split(".")
    ancestors = {".".join(parts[:i]) for i in range(1, len(parts))}
    return (path in TABLES["acted"] or path in TABLES["refused"] or path in TABLES["warned"]
            or bool(ancestors & (set(TABLES["refused"]) | set(TABLES["warned"]))))


def test_every_model_config_field_is_in_a_table() -> None:
    assert len(TABLES["paths"]) > 150  # the walk went down into the nested messages
    missing = [path for path in TABLES["paths"] if not _covered(path)]
    assert not missing, f"ModelConfig fields in none of ACTED / REFUSED / WARNED (config_fields.py): {missing}"


def test_tables_name_real_fields_once() -> None:
    rows = TABLES["acted"] + TABLES["refused"] + TABLES["warned"]
    assert sorted(set(rows) - set(TABLES["paths"])) == []
    assert len(rows) == len(set(rows)), "a field is in two tables"


def test_acted_fields_sit_under_acted_messages() -> None:
    """A field acted on is reached only through messages acted on (not under a refused or warned one)."""
    acted = set(TABLES["acted"])
    orphans = [path for path in acted if "." in path and path.rsplit(".", 1)[0] not in acted]
    assert orphans == []
