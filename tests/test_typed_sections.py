"""The stage sections of the run config, typed: defaults and rules only from the schema.

``dataset``, ``audit``, ``validate``, ``merge``, ``reaudit`` and ``export`` are each typed in the stage
module that owns them, by a ``from_dict`` that fills the schema's defaults and validates against it
(``regen.runconfig.validated``); a bad value is refused naming ``section.field``.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from regen.ingest.audit import FLAG_NAMES, AuditConfig
from regen.ingest.dataset import DatasetConfig
from regen.ingest.shard_count import ShardsConfig
from regen.output.export import ExportConfig
from regen.output.merge import MergeConfig
from regen.output.reaudit import ReauditGates
from regen.output.validate import ValidateConfig
from regen.runconfig import ConfigError, section_schema

#: the typed stage sections and the schema section each types
SECTIONS: list[tuple[type, str]] = [
    (DatasetConfig, "dataset"),
    (AuditConfig, "audit"),
    (ValidateConfig, "validate"),
    (MergeConfig, "merge"),
    (ReauditGates, "reaudit"),
    (ExportConfig, "export"),
    (ShardsConfig, "shards"),
]


def schema_defaults(schema: dict[str, Any]) -> dict[str, Any]:
    """Every property's default, nested objects as their own property defaults."""
    out = {}
    for key, prop in schema["properties"].items():
        if prop.get("properties"):
            out[key] = schema_defaults(prop)
        elif "default" in prop:
            out[key] = prop["default"]
    return out


@pytest.mark.parametrize(("cls", "section"), [s for s in SECTIONS if s[1] not in ("audit", "export")])
def test_a_flat_section_is_the_schema_s_defaults_when_empty(cls: type, section: str) -> None:
    assert dataclasses.asdict(cls.from_dict({})) == schema_defaults(section_schema(section))
    assert dataclasses.asdict(cls.from_dict(None)) == schema_defaults(section_schema(section))


def test_the_audit_section_is_the_schema_s_defaults_when_empty() -> None:
    want = schema_defaults(section_schema("audit"))
    got = AuditConfig.from_dict({})
    assert (got.context_limit, got.scaffolding_max_tokens, got.override_gates) == (
        want["context_limit"],
        want["scaffolding_max_tokens"],
        want["override_gates"],
    )
    assert got.gates == want["gates"] and got.exclude == frozenset(want["exclude"])
    assert got.exclude <= set(FLAG_NAMES)  # the schema's flags are the audit's
    assert got.decontamination.ngram == want["decontamination"]["ngram"]
    assert got.decontamination.benchmarks == () == tuple(want["decontamination"]["benchmarks"])
    assert got.regenerate is None  # not given: the summary says the schema's default was assumed
    assert AuditConfig.from_dict({}, "all").regenerate == "all"


def test_the_export_section_is_the_schema_s_defaults_when_empty() -> None:
    want = schema_defaults(section_schema("export"))
    got = ExportConfig.from_dict({})
    fields = {f.name: getattr(got, f.name) for f in dataclasses.fields(got) if f.name != "policy"}
    assert {**fields, **dataclasses.asdict(got.policy)} == want


def test_a_given_value_wins_over_the_default() -> None:
    assert ValidateConfig.from_dict({"max_content_chars": 7}).max_content_chars == 7
    merged = MergeConfig.from_dict({"rows_per_row_group": 3, "output_prefix": "s3://b/p"})
    assert (merged.rows_per_row_group, merged.output_prefix) == (3, "s3://b/p")
    assert ReauditGates.from_dict({"min_rows": 0, "override_gates": True}).min_rows == 0
    assert DatasetConfig.from_dict({"path": "x.jsonl", "id_column": "id"}).id_column == "id"
    audit = AuditConfig.from_dict({"gates": {"max_unread_tail_files": 2}})
    assert audit.gates["max_unread_tail_files"] == 2
    assert (
        audit.gates["max_over_length_fraction"]
        == schema_defaults(section_schema("audit"))["gates"]["max_over_length_fraction"]
    )
    assert ExportConfig.from_dict({"include_truncated": True}).policy.include_truncated


@pytest.mark.parametrize(
    ("cls", "raw", "where"),
    [
        (DatasetConfig, {"format": "chatml"}, r"^dataset\.format: "),
        (DatasetConfig, {"on_bad_row": "ignore"}, r"^dataset\.on_bad_row: "),
        (AuditConfig, {"context_limit": 0}, r"^audit\.context_limit: "),
        (
            AuditConfig,
            {"gates": {"max_over_length_fraction": 2}},
            r"^audit\.gates\.max_over_length_fraction: ",
        ),
        (AuditConfig, {"gates": {"max_typo_fraction": 0.1}}, r"^audit\.gates: .*max_typo_fraction"),
        (AuditConfig, {"exclude": ["nope"]}, r"^audit\.exclude\.0: "),
        (AuditConfig, {"decontamination": {"ngram": 0}}, r"^audit\.decontamination\.ngram: "),
        (ValidateConfig, {"max_content_chars": 0}, r"^validate\.max_content_chars: "),
        (ValidateConfig, {"quarantine_truncated": "yes"}, r"^validate\.quarantine_truncated: "),
        (MergeConfig, {"rows_per_row_group": 0}, r"^merge\.rows_per_row_group: "),
        (MergeConfig, {"include_token_ids": 1}, r"^merge\.include_token_ids: "),
        (ReauditGates, {"max_truncated_fraction": 1.5}, r"^reaudit\.max_truncated_fraction: "),
        (ReauditGates, {"min_rows": -1}, r"^reaudit\.min_rows: "),
        (ExportConfig, {"over_max_length": "truncate"}, r"^export\.over_max_length: "),
        (ExportConfig, {"eval_fraction": -0.1}, r"^export\.eval_fraction: "),
    ],
)
def test_a_bad_value_is_refused_naming_section_and_field(cls: type, raw: dict, where: str) -> None:
    with pytest.raises(ConfigError, match=where):
        cls.from_dict(raw)


@pytest.mark.parametrize(("cls", "section"), SECTIONS)
def test_an_unknown_key_is_refused_naming_the_section(cls: type, section: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{section}\.\(section\): .*not_a_key"):
        cls.from_dict({"not_a_key": 1})


def test_the_regenerate_mode_given_with_the_audit_section_is_checked() -> None:
    with pytest.raises(ValueError, match=r"generate\.regenerate: 'some'"):
        AuditConfig.from_dict({}, "some")


@pytest.mark.parametrize(("cls", "section"), SECTIONS)
def test_a_typed_section_writes_no_default_of_its_own(cls: type, section: str) -> None:
    """Every field is set by ``from_dict`` from the filled section: none has a dataclass default that could
    drift from the schema's, and every key of the schema section reaches the typed object."""
    declared = {f.name: f for f in dataclasses.fields(cls)}
    with_default = [
        name
        for name, f in declared.items()
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]
    assert with_default == [], with_default
    keys = set(section_schema(section)["properties"])
    if cls is ExportConfig:  # the mask settings are typed once, as the export's MaskPolicy
        keys -= {f.name for f in dataclasses.fields(ExportConfig.from_dict({}).policy)}
        keys.add("policy")
    assert set(declared) - {"regenerate"} == keys  # regenerate: generate.regenerate, given beside the section


# ------------------------------------------------------------ the config read one way (issue 51) --
ROOT = Path(__file__).resolve().parents[1]
#: the loader: the only modules that read a loaded config by key
LOADER = frozenset({"regen/configfile.py", "regen/runconfig.py"})
#: functions that read the config as configured on purpose: Snakemake's tracked rule params, whose repr
#: decides reruns (typing them would change it and rerun every existing run's jobs once)
READ_AS_CONFIGURED = frozenset(
    {("regen/fingerprint.py", "decisive_config"), ("regen/fingerprint.py", "decisive_plan_config")}
)
#: the name a loaded config goes by (``config`` in rules, scripts and regen alike)
CONFIG_NAMES = frozenset({"config"})
#: calls that read a config another way: a dotted getter, a second default filler, Snakemake's lookup
#: (the rules' own reading, fine in .smk files), or a YAML load outside the loader
RAW_CALLS = frozenset({"_get", "with_schema_defaults", "lookup", "safe_load"})
#: the typed owners' constructors a section is handed to
OWNERS = frozenset({"from_dict", "from_mapping", "from_config", "validated"})


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


class RawReads(ast.NodeVisitor):
    """Raw reads of the run config in one Python file: ``config[...]`` and ``config.get(...)``, the same on
    a name bound from one (``server = config.get("server") or {}``; ``server.get("mode")``), subscripts of
    ``snakemake.params.X``, :data:`RAW_CALLS`, and ``config_section(...)`` not handed to its owner."""

    def __init__(self, rel: str) -> None:
        self.rel = rel
        self.found: list[str] = []
        self.scopes: list[tuple[str, set[str]]] = [("<module>", set())]
        self.handed: set[int] = set()

    def _raw(self, node: ast.AST) -> bool:
        tainted = self.scopes[-1][1]
        if isinstance(node, ast.Subscript):
            v = node.value
            params = isinstance(v, ast.Attribute) and isinstance(v.value, ast.Attribute)
            params = params and v.value.attr == "params" and _name(v.value.value) == "snakemake"
            named = isinstance(v, ast.Name) and (v.id in CONFIG_NAMES or v.id in tainted)
            return named or params or self._raw(v)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            v = node.func.value
            return (isinstance(v, ast.Name) and (v.id in CONFIG_NAMES or v.id in tainted)) or self._raw(v)
        return False

    def _add(self, node: ast.AST, what: str) -> None:
        if (self.rel, self.scopes[-1][0]) not in READ_AS_CONFIGURED:
            self.found.append(f"{self.rel}:{node.lineno}: {what}")

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scopes.append((node.name, set()))
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        if any(self._raw(n) for n in ast.walk(node.value)):
            self.scopes[-1][1].update(t.id for t in node.targets if isinstance(t, ast.Name))
        for target in node.targets:
            self.visit(target)

    def visit_Call(self, node: ast.Call) -> None:
        called = _name(node.func)
        if called in OWNERS:
            self.handed.update(id(a) for a in node.args)
        if called in RAW_CALLS and (isinstance(node.func, ast.Name) or called == "safe_load"):
            self._add(node, f"{called}()")  # a method of the same name (storage's self._get) is not one
        if called == "config_section" and id(node) not in self.handed:
            self._add(node, "config_section() not handed to its owner's from_dict")
        if self._raw(node):
            self._add(node, ast.unparse(node))
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if self._raw(node):
            self._add(node, ast.unparse(node))  # config["a"]["b"]: once
        else:
            self.generic_visit(node)


def raw_reads_in_python(rel: str, text: str) -> list[str]:
    scan = RawReads(rel)
    scan.visit(ast.parse(text))
    return scan.found


def raw_reads_in_rules(rel: str, text: str) -> list[str]:
    """``config[...]`` and ``config.get(...)`` in a Snakefile or rule file (``lookup`` is the rules' own)."""
    return [
        f"{rel}:{i}: {line.strip()}"
        for i, line in enumerate(text.splitlines(), 1)
        if re.search(r"\bconfig(\[|\.get\()", line)
    ]


def raw_config_reads(root: Path) -> list[str]:
    """Every raw read of the run config outside the loader, in regen/, scripts/, rules/ and the Snakefile."""
    found = []
    for path in sorted([*root.glob("regen/**/*.py"), *root.glob("scripts/*.py")]):
        rel = path.relative_to(root).as_posix()
        if rel not in LOADER:
            found += raw_reads_in_python(rel, path.read_text())
    for path in sorted([*root.glob("rules/*.smk"), root / "Snakefile"]):
        found += raw_reads_in_rules(path.relative_to(root).as_posix(), path.read_text())
    return found


def test_no_raw_config_read_outside_the_loader() -> None:
    """Every reader takes its section typed from the owner (``X.from_dict(config_section(config, "x"))``,
    a rule's ``lookup`` handed to a script's ``from_dict``, or the ``RunConfig``), the config loaded one
    way (``regen.configfile.load_config`` or the workflow's ``validate_config``)."""
    assert raw_config_reads(ROOT) == []


@pytest.mark.parametrize(
    "source",
    [
        'def f(config):\n    return config["dataset"]["path"]\n',
        'def f(config):\n    server = config.get("server") or {}\n    return server.get("mode")\n',
        'def f(config):\n    return _get(config, "server.mode")\n',
        "import yaml\ndef f(p):\n    return yaml.safe_load(open(p))\n",
        'def f(config):\n    return config_section(config, "dataset")["path"]\n',
        'x = ServerConfig.from_mapping(snakemake.params.settings["server"])\n',
        "def f(config):\n    return with_schema_defaults(config, schema)\n",
    ],
)
def test_the_scan_finds_a_raw_read(source: str) -> None:
    assert raw_reads_in_python("regen/x.py", source), source


def test_the_scan_passes_a_typed_read_and_finds_one_in_a_rule() -> None:
    typed = 'def f(config):\n    return DatasetConfig.from_dict(config_section(config, "dataset")).path\n'
    assert raw_reads_in_python("regen/x.py", typed) == []
    assert raw_reads_in_rules("rules/x.smk", 'if config["dataset"]["path"]:\n    pass\n')
    assert raw_reads_in_rules("rules/x.smk", 'x = lookup(dpath="dataset", within=config)\n') == []


def _default_fillers(root: Path) -> list[str]:
    """Functions that write a schema ``default`` into a mapping (read ``[..."default"]`` and assign to a
    subscript in the same function body, nested functions apart)."""
    found = []
    for path in sorted(root.glob("regen/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            own = [n for stmt in node.body for n in ast.walk(stmt)]
            nested = {
                id(n) for d in own if d is not node and isinstance(d, ast.FunctionDef) for n in ast.walk(d)
            }
            own = [n for n in own if id(n) not in nested or isinstance(n, ast.FunctionDef)]
            reads = any(
                isinstance(n, ast.Subscript)
                and isinstance(n.slice, ast.Constant)
                and n.slice.value == "default"
                for n in own
            )
            writes = any(
                isinstance(n, ast.Assign) and any(isinstance(t, ast.Subscript) for t in n.targets)
                for n in own
            )
            if reads and writes:
                found.append(f"{path.relative_to(root).as_posix()}:{node.name}")
    return found


def test_one_default_filler() -> None:
    """The schema's defaults reach a config in one place, ``regen.runconfig.filling_validator`` (its
    ``set_defaults``): the workflow's whole config, ``load_config`` and each owner's section alike."""
    assert _default_fillers(ROOT) == ["regen/runconfig.py:set_defaults"]


def test_a_section_its_owner_fills_is_the_section_the_loader_filled() -> None:
    """One filler: each section as the files give it, filled by its owner (``validated``), equals the
    same section of the whole config filled by the loader, arrays' items included (the demo's
    decontamination benchmarks get their ``field``)."""
    from regen.configfile import load_config, merged, read_layers
    from regen.runconfig import config_schema, validated

    files = [ROOT / "config" / "config.yaml", ROOT / "config" / "demo.yaml"]
    given, loaded = merged(read_layers(files)), load_config(files)
    sections = [name for name, prop in config_schema()["properties"].items() if prop.get("type") == "object"]
    assert "dataset" in sections and "generate" in sections and "audit" in sections
    for name in sections:
        assert validated(name, given.get(name)) == loaded[name], name
    (benchmark,) = loaded["audit"]["decontamination"]["benchmarks"]
    assert "field" not in given["audit"]["decontamination"]["benchmarks"][0] and benchmark["field"]


def _repeated_defaults_in_calls(root: Path) -> list[str]:
    """Call keywords ``key=VALUE`` in regen/ where ``key`` is a config key and VALUE its schema default
    (a second copy of the default, as ``Workload(..., max_tokens=4096)`` was); 0, 1 and -1 are too
    common to tell."""
    from regen.runconfig import config_schema

    defaults: dict[str, list[Any]] = {}

    def walk(schema: dict[str, Any]) -> None:
        for key, prop in (schema.get("properties") or {}).items():
            value = prop.get("default")
            if (
                isinstance(value, int | float | str)
                and not isinstance(value, bool)
                and value not in (0, 1, -1)
            ):
                defaults.setdefault(key, []).append(value)
            walk(prop)
            if isinstance(prop.get("items"), dict):
                walk(prop["items"])

    walk(config_schema())
    found = []
    for path in sorted(root.glob("regen/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            for kw in node.keywords if isinstance(node, ast.Call) else ():
                if isinstance(kw.value, ast.Constant) and kw.value.value in defaults.get(kw.arg or "", []):
                    found.append(
                        f"{path.relative_to(root).as_posix()}:{node.lineno}: {kw.arg}={kw.value.value!r}"
                    )
    return found


def test_no_config_default_is_repeated_in_a_call() -> None:
    assert _repeated_defaults_in_calls(ROOT) == []
