"""arenaflow.configref: docs/configuration.md is the schemas' current reference, every key of the
schemas has a meaning, and the walker renders paths, types and defaults as the schemas say."""

from __future__ import annotations

import yaml

from arenaflow import schema
from arenaflow.configref import document, walk
from arenaflow.configref.document import COMMAND
from arenaflow.configref.walk import Reference

DOC = schema.SCHEMA_DIR.parents[1] / "docs" / "configuration.md"
# schema keywords whose values are schemas (or lists of them); `if` is a condition, not keys
SUBSCHEMAS = ("additionalProperties", "items", "propertyNames", "then", "else", "not", "$defs")
ALTERNATIVES = ("oneOf", "anyOf", "allOf", "prefixItems")


def raw_properties(node, where: str):
    """(location, name, schema) of every property written in a schema, however deep, except
    inside an `if` (a condition such as `kind: {const: math}` is not a key)."""
    if not isinstance(node, dict):
        return
    for name, prop in (node.get("properties") or {}).items():
        yield f"{where}/properties/{name}", name, prop
        yield from raw_properties(prop, f"{where}/properties/{name}")
    for kw in SUBSCHEMAS:
        sub = node.get(kw)
        if kw == "$defs" and isinstance(sub, dict):
            for name, d in sub.items():
                yield from raw_properties(d, f"{where}/$defs/{name}")
        elif isinstance(sub, dict):
            yield from raw_properties(sub, f"{where}/{kw}")
    for kw in ALTERNATIVES:
        for i, alt in enumerate(node.get(kw) or []):
            yield from raw_properties(alt, f"{where}/{kw}/{i}")


def row(text: str, path: str) -> list[str]:
    """The cells of a key's row in the reference."""
    start = f"| `{path}` |"
    lines = [ln for ln in text.splitlines() if ln.startswith(start)]
    assert len(lines) == 1, f"{path}: {len(lines)} rows in docs/configuration.md"
    return [c.strip() for c in lines[0].strip("|").split(" | ")]


def cell_value(cell: str):
    assert cell.startswith("`") and cell.endswith("`"), cell
    return yaml.safe_load(cell.strip("`"))


# --- the committed document ---------------------------------------------------------------


def test_committed_reference_is_current():
    assert DOC.read_text() == document.render(), (
        f"docs/configuration.md does not match workflow/schemas; regenerate it: {COMMAND}"
    )


def test_reference_says_it_is_generated_and_how():
    head = "\n".join(DOC.read_text().splitlines()[:5])
    assert COMMAND in head and "Do not edit by hand" in head


def test_cli_writes_what_render_returns(tmp_path, capsys):
    out = tmp_path / "configuration.md"
    assert document.main(["--out", str(out)]) == 0
    assert out.read_text() == document.render()
    document.main([])
    assert capsys.readouterr().out == document.render()


# --- the schemas --------------------------------------------------------------------------


def test_every_property_has_a_description():
    docs = document.load()
    missing = [k.path for k in document.all_keys(docs) if not k.described]
    for file, doc in docs.items():
        missing += [
            f"{file}#{loc}"
            for loc, _, prop in raw_properties(doc, "")
            if not (isinstance(prop, dict) and str(prop.get("description", "")).strip())
        ]
    assert not missing, "properties without a description:\n" + "\n".join(missing)


def test_every_property_of_the_schemas_is_listed():
    """Each property written in the schemas (outside `if` conditions) ends some listed path."""
    docs = document.load()
    listed = {k.path.rsplit(".", 1)[-1] for k in document.all_keys(docs)}
    absent = sorted(
        f"{file}#{loc}"
        for file, doc in docs.items()
        for loc, name, _ in raw_properties(doc, "")
        if name not in listed
    )
    assert not absent, absent


def test_real_keys_appear_with_the_schemas_defaults():
    text = DOC.read_text()
    hyper, regime = schema.hyper_defaults(), schema.schema_defaults("regime")
    expected = {
        "train_defaults.epochs": hyper["epochs"],
        "train_defaults.zero_stage": hyper["zero_stage"],
        "hyper.objective": hyper["objective"],
        "hyper.max_steps": hyper["max_steps"],
        "arm_overrides.<arm>.hyper.length_bucketing": hyper["length_bucketing"],
        "evals.<suite>.regimes.<regime>.temperature": regime["temperature"],
        "evals.<suite>.regimes.<regime>.max_new_tokens": regime["max_new_tokens"],
        "pools.<pool>.kind": schema.schema_defaults("pool")["kind"],
        "budget.history": schema.schema_defaults("budget")["history"],
        "rounds.<round>.bar[].noise.times": schema.schema_defaults("noise")["times"],
        "budget.estimate.row_seconds": schema.schema_defaults("estimate")["row_seconds"],
        "corpora.<corpus>.scaffold.marker": "FINAL:",
    }
    for path, default in expected.items():
        assert cell_value(row(text, path)[2]) == default, path
    # no default: the cell is empty, or says the key is required
    lr = row(text, "train_defaults.lr")
    assert lr[1:3] == ["number in (0, 1]", ""] and lr[3] == "peak learning rate"
    assert row(text, "base.path")[2] == "required"
    assert row(text, "evals.<suite>.regimes.<regime>.temperature")[1] == "number >= 0"
    assert row(text, "rounds.<round>.bar[].metric")[1].startswith("one of `delta`, `p_value`")


# --- the walker ---------------------------------------------------------------------------


TOY = {
    "toy.yaml": {
        "type": "object",
        "required": ["things"],
        "$defs": {
            "id": {"type": "string", "pattern": "^[a-z]+$", "description": "a lower-case id"},
            "knob": {
                "type": "object",
                "properties": {
                    "level": {"enum": ["low", "high"], "default": "low", "description": "how far"}
                },
            },
            "tree": {"type": "object", "properties": {"child": {"$ref": "#/$defs/tree"}}},
            "mode": {"enum": ["a", "b"], "default": "a", "description": "a mode"},
        },
        "properties": {
            "things": {
                "description": "things, by id",
                "type": "object",
                "propertyNames": {"$ref": "#/$defs/id"},
                "additionalProperties": {
                    "type": "object",
                    "required": ["size"],
                    "properties": {
                        "size": {"type": "integer", "minimum": 1, "maximum": 9},
                        "knob": {"$ref": "#/$defs/knob", "description": "its knob"},
                        "tags": {"type": "array", "items": {"type": "string"}, "default": []},
                    },
                },
            },
            "name": {"$ref": "#/$defs/id", "default": "x"},
            "mode": {"$ref": "#/$defs/mode", "description": "which mode"},
            "tune": {"$ref": "other.yaml#/$defs/tune"},
            "tree": {"$ref": "#/$defs/tree", "description": "a recursive schema"},
        },
    },
    "other.yaml": {
        "$defs": {
            "tune": {
                "type": "object",
                "description": "tuning, from another file",
                "properties": {"rate": {"type": "number", "exclusiveMinimum": 0, "default": 0.5}},
            }
        }
    },
}


def test_walker_renders_paths_types_and_defaults():
    keys = {k.path: k for k in Reference(TOY).keys("toy.yaml", TOY["toy.yaml"])}
    got = {p: (k.type, k.default) for p, k in keys.items()}
    assert got == {
        "things": ("map from [id](#type-id) to object", "required"),
        "things.<thing>.size": ("integer in [1, 9]", "required"),
        "things.<thing>.knob": ("object", ""),
        "things.<thing>.knob.level": ("one of `low`, `high`", "`low`"),
        "things.<thing>.tags": ("list of strings", "`[]`"),
        "name": ("[id](#type-id)", "`x`"),
        "mode": ("[mode](#type-mode)", "`a`"),  # the default a named type carries
        "tune": ("object", ""),
        "tune.rate": ("number > 0", "`0.5`"),
        "tree": ("object", ""),
        "tree.child": ("`#/$defs/tree`", ""),  # the cycle is named, not followed
    }
    # a meaning is the key's own description, else its $ref target's; `described` is own only
    assert (keys["things.<thing>.knob"].meaning, keys["things.<thing>.knob"].described) == (
        "its knob",
        True,
    )
    assert (keys["name"].meaning, keys["name"].described) == ("a lower-case id", False)
    assert (keys["tune"].meaning, keys["tune"].described) == ("tuning, from another file", False)
    assert not keys["things.<thing>.size"].described


def test_named_types_are_listed_once_with_their_anchor():
    named = list(Reference(TOY).named_types())
    assert [(a, n, k.type, k.default, k.meaning) for a, n, k in named] == [
        ("type-id", "id", "string matching `^[a-z]+$`", "", "a lower-case id"),
        ("type-mode", "mode", "one of `a`, `b`", "`a`", "a mode"),
    ]


def test_alternatives_ranges_and_markdown_escapes():
    ref = Reference(TOY)
    one = {
        "oneOf": [{"const": "auto"}, {"type": "array", "items": {"type": "integer"}}],
        "default": "auto",
    }
    assert ref.type_of("toy.yaml", one) == "`auto` or list of integers"
    assert ref.type_of("toy.yaml", {"type": ["number", "null"], "exclusiveMinimum": 0}) == (
        "number > 0 or null"
    )
    needs = {
        "type": "object",
        "properties": {},
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
    }
    assert ref.type_of("toy.yaml", needs) == "object; needs exactly one of `a`, `b`"
    mixed = {
        "type": "object",
        "additionalProperties": {"type": "number", "minimum": 0, "maximum": 1},
    }
    assert ref.type_of("toy.yaml", mixed) == "map from string to (number in [0, 1])"
    assert walk.prose("a <b> | *c* `x <y> | z`") == "a \\<b> \\| \\*c\\* `x <y> \\| z`"
    assert walk.yaml_value(">") == "'>'" and walk.yaml_value([1, "a"]) == "[1, a]"
