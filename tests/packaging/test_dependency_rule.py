"""The dependency rule: core depends on nothing of Lake's, services never on each other.

Proved two ways: statically (every import and every declared dependency) and
for real (wheels built, lake-sdk installed alone into a clean venv, imported).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ROOT / "packages"

# What each package may import (and declare) of Lake's own packages.
ALLOWED: dict[str, set[str]] = {
    "lake_core": set(),
    "lake_objects": {"lake_core"},
    "lake_metasrv": {"lake_core", "lake_objects"},
    "lake_query": {"lake_core", "lake_objects"},
    "lake_sdk": {"lake_core", "lake_objects"},
    "lake_gc": {"lake_core", "lake_objects"},
    "lake_iceberg": {"lake_core", "lake_objects"},
}


def _lake_imports(source_dir: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in source_dir.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top.startswith("lake_"):
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_follow_the_rule(package: str) -> None:
    source = PACKAGES / package.replace("_", "-") / "src" / package
    imports = _lake_imports(source)
    illegal = {
        name: files for name, files in imports.items() if name not in ALLOWED[package] | {package}
    }
    assert not illegal, f"{package} imports Lake packages it must not: {illegal}"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_declared_dependencies_follow_the_rule(package: str) -> None:
    project = tomllib.loads((PACKAGES / package.replace("_", "-") / "pyproject.toml").read_text())
    declared = {
        dep.split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip().replace("-", "_")
        for dep in project["project"]["dependencies"]
    }
    lake_deps = {d for d in declared if d.startswith("lake_")}
    assert lake_deps <= ALLOWED[package], f"{package} declares {lake_deps - ALLOWED[package]}"
    # Everything it imports of Lake's must be declared, or a clean install breaks.
    source = PACKAGES / package.replace("_", "-") / "src" / package
    assert set(_lake_imports(source)) - {package} <= lake_deps


#: Distributions only servers need; ``pip install lake-sdk`` must not bring any of them.
SERVER_ONLY_DISTRIBUTIONS = (
    "cryptography",  # sealed tickets, server TLS keys (lake-core[server])
    "grpcio-health-checking",  # gRPC Health on listeners (lake-core[server])
    "prometheus-client",  # /metrics (lake-core[server])
    "opentelemetry-sdk",  # OTLP traces (lake-core[server]); the SDK has the API only
    "opentelemetry-exporter-otlp-proto-grpc",
    "pylance",  # table engine (lake-metasrv, lake-query)
    "datafusion",  # SQL engine (lake-query)
    "lake-metasrv",
    "lake-query",
    "lake-gc",
    "lake-iceberg",
)
#: Modules of those distributions that importing the SDK (and its CLI) must not load.
SERVER_ONLY_MODULES = (
    "cryptography",
    "grpc_health.v1",
    "prometheus_client",
    "opentelemetry.sdk",
    "lance",
    "datafusion",
    "lake_metasrv",
    "lake_query",
    "lake_gc",
    "lake_iceberg",
)
SDK_MODULES = (
    "lake_sdk",
    "lake_sdk.demo",
    "lake_sdk.sql_cli",
    "lake_core.cli",
    "lake_core.admin_cli",
)


def _modules_loaded_by(names: Sequence[str]) -> set[str]:
    """Every module a fresh interpreter holds once it has imported ``names``."""
    probe = (
        "import importlib, json, sys\n"
        f"for name in {tuple(names)!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout.strip()
    return set(json.loads(out.splitlines()[-1]))


def test_sdk_imports_no_server_only_module() -> None:
    """Measured, not declared: what importing the SDK and its commands really loads."""
    loaded = _modules_loaded_by(SDK_MODULES)
    server_only = sorted(m for m in SERVER_ONLY_MODULES if m in loaded)
    assert not server_only, f"importing the SDK loads server-only modules: {server_only}"


@pytest.mark.parametrize("package", ["lake-metasrv", "lake-query"])
def test_services_require_the_server_extra(package: str) -> None:
    project = tomllib.loads((PACKAGES / package / "pyproject.toml").read_text())
    assert "lake-core[server]" in project["project"]["dependencies"]
    core = tomllib.loads((PACKAGES / "lake-core" / "pyproject.toml").read_text())
    server = {
        d.split(">")[0].split("<")[0] for d in core["project"]["optional-dependencies"]["server"]
    }
    base = {d.split(">")[0].split("<")[0] for d in core["project"]["dependencies"]}
    assert {"cryptography", "grpcio-health-checking"} <= server
    assert not base & set(SERVER_ONLY_DISTRIBUTIONS)


def _installer(python: Path) -> list[str]:
    """uv when it is there (seconds, from its cache), else pip (minutes)."""
    uv = shutil.which("uv")
    if uv is not None:
        return [uv, "pip", "install", "--quiet", "--python", str(python)]
    return [str(python), "-m", "pip", "install", "--quiet"]


def _footprint(site_packages: Path) -> tuple[int, int]:
    """Installed distributions (without pip/setuptools) and their total bytes on disk."""
    dists = [
        d
        for d in site_packages.glob("*.dist-info")
        if not d.name.startswith(("pip-", "setuptools-"))
    ]
    size = sum(p.stat().st_size for p in site_packages.rglob("*") if p.is_file())
    return len(dists), size


@pytest.mark.slow
def test_wheels_build_and_sdk_installs_alone(tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheels"
    for pkg in sorted(PACKAGES.iterdir()):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "build",
                "--wheel",
                "--no-isolation",
                "--outdir",
                str(wheelhouse),
                str(pkg),
            ],
            check=True,
            capture_output=True,
        )
    built = sorted(p.name.split("-")[0] for p in wheelhouse.glob("*.whl"))
    assert built == sorted(p.replace("-", "_") for p in (x.name for x in PACKAGES.iterdir()))

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=shutil.which("uv") is None, clear=True)
    python = env_dir / "bin" / "python"
    clean_env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    # Lake's own wheels from the wheelhouse, third-party packages from the index.
    subprocess.run(
        [*_installer(python), "--find-links", str(wheelhouse), "lake-sdk"],
        check=True,
        env=clean_env,
    )
    probe = (
        "import importlib, importlib.metadata as md, lake_sdk\n"
        f"for name in {SDK_MODULES!r}: importlib.import_module(name)\n"
        "assert lake_sdk.AsyncClient and lake_sdk.Client\n"
        "print(sorted(d.metadata['Name'].lower() for d in md.distributions()))"
    )
    out = subprocess.run(
        [str(python), "-c", probe], check=True, capture_output=True, text=True, env=clean_env
    ).stdout.strip()
    installed = set(ast.literal_eval(out))
    lake_installed = sorted(name for name in installed if name.startswith("lake"))
    # The SDK moves FILE bytes itself, through lake-objects (the dependency rule allows it).
    assert lake_installed == ["lake-core", "lake-objects", "lake-sdk"]
    server_only = sorted(installed & set(SERVER_ONLY_DISTRIBUTIONS))
    assert not server_only, f"lake-sdk pulled in server-only packages: {server_only}"
    site_packages = next((env_dir / "lib").glob("python3.*/site-packages"))
    count, size = _footprint(site_packages)
    print(f"lake-sdk installs {count} distributions, {size / 2**20:.1f} MiB")
    help_text = subprocess.run(
        [str(env_dir / "bin" / "lake"), "--help"],
        check=True,
        capture_output=True,
        text=True,
        env=clean_env,
    ).stdout
    assert "client" in help_text
    assert "demo" in help_text
    assert "meta" not in help_text.split("Commands:")[1]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import that runs: at module level or deferred inside a function (a deferred
    import still closes a cycle, it only hides it), but not under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from (i for child in node.orelse for i in _runtime_imports_of(child))
            continue
        yield from _runtime_imports_of(node)


def _runtime_imports_of(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    else:
        yield from _runtime_imports(node)


def _module_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports at run time."""
    source = PACKAGES / package.replace("_", "-") / "src" / package
    modules: dict[str, Path] = {}
    for path in source.rglob("*.py"):
        parts = list(path.relative_to(source.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _runtime_imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                    base = ".".join([*anchor, *([base] if base else [])])
                # ``from pkg import mod`` imports the submodule; ``from pkg import Name`` the package.
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                # A package's own ancestors are imported before it anyway: not an edge.
                if target in modules and target != name and not name.startswith(target + "."):
                    edges.add(target)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_import_cycles_inside_a_package(package: str) -> None:
    cycles = _cycles(_module_graph(package))
    assert not cycles, f"{package} has import cycles (modules importing each other): {cycles}"


def test_the_cycle_check_can_fail() -> None:
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]
    assert _cycles({"p.a": {"p.b"}, "p.b": set()}) == []


#: lake_query's folders, each with the other folders it may import (its own always).
#: serving (admission, stalls, planning threads, readiness, health, memory) and planning
#: (DataFusion over pinned versions, the catalog cache, verify, SQL errors, result batches)
#: stand alone; durable jobs run planned statements; the Flight SQL service uses all
#: three; the native data plane serves Flight SQL's tickets.
QUERY_LAYERS: dict[str, set[str]] = {
    "serving": set(),
    "planning": set(),
    "jobs": {"planning"},
    "flightsql": {"planning", "serving", "jobs"},
    "dataplane": {"planning", "serving", "flightsql"},
}
#: The only modules at lake_query's top level: start-up and the package's exports.
QUERY_TOP_LEVEL = {"__init__", "__main__", "cli", "config"}
QUERY_SOURCE = PACKAGES / "lake-query" / "src" / "lake_query"


def _query_imports(source: Path) -> dict[str, set[str]]:
    """``folder/module.py`` -> the lake_query parts it imports (a folder or a top-level
    module), every import counted, ``if TYPE_CHECKING:`` ones included."""
    found: dict[str, set[str]] = {}
    for path in sorted(source.rglob("*.py")):
        relative = path.relative_to(source)
        if len(relative.parts) < 2:
            continue  # top level: may import every folder
        names: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{relative}: relative import"
                module = node.module or ""
                # ``from lake_query import planning`` names the folder it imports.
                names += (
                    [f"{module}.{a.name}" for a in node.names]
                    if module == "lake_query"
                    else [module]
                )
        parts = {n.split(".")[1] for n in names if n.startswith("lake_query.")}
        found[str(relative)] = parts
    return found


def _layer_violations(imports: dict[str, set[str]]) -> list[str]:
    """``folder/module.py imports part`` for every import the layers do not allow."""
    wrong: list[str] = []
    for module, parts in sorted(imports.items()):
        folder = module.split("/")[0]
        allowed = QUERY_LAYERS.get(folder, set()) | {folder}
        wrong += [f"{module} imports lake_query.{part}" for part in sorted(parts - allowed)]
    return wrong


def test_query_is_laid_out_in_folders_by_concern() -> None:
    folders = {p.parent.name for p in QUERY_SOURCE.glob("*/__init__.py")}
    assert folders == set(QUERY_LAYERS)
    top_level = {p.stem for p in QUERY_SOURCE.glob("*.py")}
    assert top_level == QUERY_TOP_LEVEL, (
        f"modules to put in a folder: {top_level - QUERY_TOP_LEVEL}"
    )
    # One module name per meaning: no folder repeats the name of another folder's module
    # for something else (``statements``, ``results`` once meant two things each).
    for clash in ("statements", "results"):
        homes = sorted(str(p.relative_to(QUERY_SOURCE)) for p in QUERY_SOURCE.rglob(f"{clash}.py"))
        assert len(homes) <= 1, f"{clash}.py means two things: {homes}"


def test_query_folders_import_only_their_layers() -> None:
    imports = _query_imports(QUERY_SOURCE)
    assert {m.split("/")[0] for m in imports} == set(QUERY_LAYERS)
    violations = _layer_violations(imports)
    assert not violations, f"lake_query's layering broken: {violations}"


def test_the_layer_check_can_fail() -> None:
    assert _layer_violations({"planning/planner.py": {"planning"}}) == []
    assert _layer_violations({"planning/planner.py": {"flightsql"}}) == [
        "planning/planner.py imports lake_query.flightsql"
    ]
    assert _layer_violations({"serving/admission.py": {"planning", "cli"}}) == [
        "serving/admission.py imports lake_query.cli",
        "serving/admission.py imports lake_query.planning",
    ]
    assert _query_imports(QUERY_SOURCE)["dataplane/server.py"] >= {"flightsql", "serving"}


def test_query_finds_the_iceberg_plugin_only_by_entry_point() -> None:
    """lake-query never names lake_iceberg (not even in a string); lake-iceberg registers itself."""
    source = PACKAGES / "lake-query" / "src" / "lake_query"
    mentions = [
        str(p.relative_to(ROOT)) for p in source.rglob("*.py") if "lake_iceberg" in p.read_text()
    ]
    assert not mentions, f"lake_query names lake_iceberg: {mentions}"
    query = tomllib.loads((PACKAGES / "lake-query" / "pyproject.toml").read_text())
    assert not any("iceberg" in d for d in query["project"]["dependencies"])
    iceberg = tomllib.loads((PACKAGES / "lake-iceberg" / "pyproject.toml").read_text())
    plugins = iceberg["project"]["entry-points"]["lake.query.plugins"]
    assert plugins == {"iceberg": "lake_iceberg.federation.plugin:plugin"}


@pytest.mark.slow
def test_lake_query_installs_and_configures_without_the_iceberg_plugin(tmp_path: Path) -> None:
    """``pip install lake-query`` alone: native configuration loads; Iceberg variables name the install."""
    wheelhouse = tmp_path / "wheels"
    for pkg in ("lake-core", "lake-objects", "lake-query"):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "build",
                "--wheel",
                "--no-isolation",
                "--outdir",
                str(wheelhouse),
                str(PACKAGES / pkg),
            ],
            check=True,
            capture_output=True,
        )
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=shutil.which("uv") is None, clear=True)
    python = env_dir / "bin" / "python"
    clean_env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    subprocess.run(
        [*_installer(python), "--find-links", str(wheelhouse), "lake-query"],
        check=True,
        env=clean_env,
    )
    probe = (
        "import importlib.util, sys\n"
        "from lake_core.errors import ConfigError\n"
        "from lake_query.config import QueryConfig\n"
        "assert importlib.util.find_spec('lake_iceberg') is None\n"
        "assert QueryConfig.load(env={}).external == ()\n"
        "try:\n"
        "    QueryConfig.load(env={'LAKE_ICEBERG_REST_ENDPOINT': 'https://c.example.com',\n"
        "        'LAKE_ICEBERG_WAREHOUSE': 'w', 'LAKE_ICEBERG_NAMESPACES': 'a'})\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    sys.exit('Iceberg variables without the plug-in must not load')\n"
    )
    out = subprocess.run(
        [str(python), "-c", probe], check=True, capture_output=True, text=True, env=clean_env
    ).stdout
    assert "pip install ./packages/lake-iceberg" in out


# -- Metasrv's folders: one per seam, interface and implementations side by side ------------

METASRV = PACKAGES / "lake-metasrv" / "src" / "lake_metasrv"
#: Each seam's folder: its interface, its local implementation, its cloud implementation.
SEAMS = {
    "engine": ("base", "local", "s3"),
    "sidecars": ("base", "local", "s3"),
    "digests": ("base", "local", "s3"),
    "registry": ("base", "sqlite", "dynamo"),
}
BOTO = frozenset({"boto3", "botocore", "aioboto3", "aiobotocore"})
#: Every Metasrv module that imports boto (derived from the code, pinned: a new one is a choice).
BOTO_IMPORTERS = {
    "lake_metasrv.boto_errors",
    "lake_metasrv.cloud",
    "lake_metasrv.engine.s3",
    "lake_metasrv.registry.dynamo_layout",
    "lake_metasrv.registry.dynamo_table",
}


#: Cloud-mode modules outside the seams' folders: wiring, boto errors, the lease in
#: DynamoDB and followers forwarding writes to its holder.
CLOUD_MODULES = frozenset(
    f"lake_metasrv.{m}" for m in ("cloud", "boto_errors", "lease", "forwarding")
)


def _cloud_side(module: str) -> bool:
    """S3 and DynamoDB code: the seams' cloud implementations, their helpers, the wiring."""
    parts = module.split(".")
    return (
        parts[-1] == "s3"
        or parts[1:3] == ["registry", "dynamo"]
        or module.startswith("lake_metasrv.registry.dynamo_")
        or module in CLOUD_MODULES
    )


def _reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports at run time, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _third_party_imports(package: str) -> dict[str, set[str]]:
    """Module -> the top-level names it imports at run time from outside Lake."""
    source = PACKAGES / package.replace("_", "-") / "src" / package
    found: dict[str, set[str]] = {}
    for path in source.rglob("*.py"):
        parts = list(path.relative_to(source.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        tops: set[str] = set()
        for node in _runtime_imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                tops |= {alias.name.split(".")[0] for alias in node.names}
            elif node.module and not node.level:
                tops.add(node.module.split(".")[0])
        found[".".join(parts)] = {t for t in tops if not t.startswith("lake_")}
    return found


def test_metasrv_has_a_folder_per_seam() -> None:
    for seam, modules in SEAMS.items():
        assert (METASRV / seam / "__init__.py").is_file(), f"lake_metasrv/{seam}/ is not a package"
        for module in modules:
            assert (METASRV / seam / f"{module}.py").is_file(), (
                f"no lake_metasrv/{seam}/{module}.py"
            )
    # The flat modules they replaced are gone (no second home for the same code).
    for old in ("engine", "s3engine", "sidecars", "integrity"):
        assert not (METASRV / f"{old}.py").exists(), f"lake_metasrv/{old}.py is back"


def test_cloud_side_is_what_the_rule_says() -> None:
    """The classifier below the rules: checked on names, so it cannot silently match nothing."""
    graph = _module_graph("lake_metasrv")
    cloud = {m for m in graph if _cloud_side(m)}
    assert {f"lake_metasrv.{seam}.s3" for seam in ("engine", "sidecars", "digests")} <= cloud
    assert {"lake_metasrv.registry.dynamo", *CLOUD_MODULES} <= cloud
    assert not {m for m in cloud if m.endswith((".base", ".local", ".sqlite"))}


@pytest.mark.parametrize("seam", sorted(SEAMS))
def test_a_seams_interface_imports_no_implementation(seam: str) -> None:
    graph = _module_graph("lake_metasrv")
    implementations = {
        f"lake_metasrv.{name}.{module}" for name, (_, *impls) in SEAMS.items() for module in impls
    }
    reached = _reached(graph, f"lake_metasrv.{seam}.base")
    assert not reached & implementations, f"{seam}.base imports {sorted(reached & implementations)}"
    assert not {m for m in reached if _cloud_side(m)}


@pytest.mark.parametrize(
    "module",
    [f"{seam}.{SEAMS[seam][1]}" for seam in sorted(SEAMS)] + sorted(SEAMS),
)
def test_local_implementations_never_reach_the_cloud_side(module: str) -> None:
    """A local implementation (and a seam's package, which re-exports it) imports no S3,
    DynamoDB or boto code, directly or through another module, deferred imports included."""
    graph = _module_graph("lake_metasrv")
    third_party = _third_party_imports("lake_metasrv")
    name = f"lake_metasrv.{module}"
    reached = _reached(graph, name) | {name}
    cloud = sorted(m for m in reached if _cloud_side(m))
    assert not cloud, f"{name} imports cloud-side modules: {cloud}"
    boto = sorted({t for m in reached for t in third_party[m]} & BOTO)
    assert not boto, f"{name} imports {boto}"


def test_only_the_cloud_side_imports_boto() -> None:
    third_party = _third_party_imports("lake_metasrv")
    importers = {m for m, tops in third_party.items() if tops & BOTO}
    assert importers == BOTO_IMPORTERS
    assert all(_cloud_side(m) for m in importers)


def test_only_the_cli_reaches_into_cloud_mode() -> None:
    """Outside the cloud side, only ``lake meta`` names it, through its wiring module."""
    graph = _module_graph("lake_metasrv")
    entries = {
        (module, target)
        for module, targets in graph.items()
        if not _cloud_side(module)
        for target in targets
        if _cloud_side(target)
    }
    assert entries == {("lake_metasrv.cli", "lake_metasrv.cloud")}


def test_a_local_metasrv_loads_no_cloud_code() -> None:
    """Measured, not declared: what importing the local server and ``lake table`` loads."""
    loaded = _modules_loaded_by(
        [
            "lake_metasrv",
            "lake_metasrv.cli",
            "lake_metasrv.service",
            *(f"lake_metasrv.{seam}" for seam in sorted(SEAMS)),
        ]
    )
    assert "lake_metasrv.engine.local" in loaded  # the probe imported the local server
    cloud = sorted(
        m
        for m in loaded
        if m.split(".")[0] in BOTO or (m.startswith("lake_metasrv.") and _cloud_side(m))
    )
    assert not cloud, f"a local Metasrv loads cloud code: {cloud}"
