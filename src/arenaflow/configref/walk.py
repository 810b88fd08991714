"""The walk over the configuration schemas that arenaflow.configref.document lists.

Reference walks a set of schemas by file name and yields every key they can reach (Key: its
dotted path, type, default and meaning, as Markdown). A map's key is written `<pool>`, `<suite>`,
... (`pools.<pool>.n`), a list's item `[]` (`rounds.<round>.bar[].metric`).
A `$ref` to a $def that holds no keys of its own (`id`, `engine`, `rank`) is a named type, listed
once under "Shared types" and linked; any other `$ref` (`hyper`, `ref`, a pool) is inlined
under the key that uses it, so each of its keys appears at every path it can be written at.
`if`/`then`/`else` conditions inside an object (which keys each pool kind takes) are not walked:
the object's description says what they mean.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import yaml

# The word a map's key is written as in a dotted path, by the map's own key; other maps take
# their key's name without a trailing "s" (`<thing>` for `things`), or `<key>`.
MAP_KEYS = {
    "pools": "pool",
    "corpora": "corpus",
    "evals": "suite",
    "regimes": "regime",
    "system_prompts": "prompt",
    "prompt_search": "search",
    "rounds": "round",
    "bundles": "bundle",
    "judged": "read",
    "mc_guards": "guard",
    "arm_overrides": "arm",
    "categories": "category",
    "min_per_group": "group",
    "max_per_group": "group",
    "of": "arm",
    "corpus": "corpus",
}


@dataclass(frozen=True)
class Key:
    """One key of a schema, as the reference lists it."""

    path: str  # dotted: pools.<pool>.n
    type: str  # Markdown
    default: str  # Markdown: the default as YAML, "required", or ""
    meaning: str  # the description, whitespace collapsed ("" where there is none)
    described: bool  # whether the key's own schema has a non-empty description


def map_key(name: str) -> str:
    if name in MAP_KEYS:
        return MAP_KEYS[name]
    return name[:-1] if name.endswith("s") and len(name) > 1 else "key"


def yaml_value(value) -> str:
    """A value as one line of YAML flow style (what a config file would hold)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=2**31, sort_keys=True)
    return text.removesuffix("\n...\n").rstrip("\n")


def code(text: str) -> str:
    """Text as a code span that survives a Markdown table cell."""
    text = text.replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def prose(text: str) -> str:
    """A description as one line of a table cell: whitespace collapsed; outside code spans, the
    characters Markdown would read as a tag or emphasis escaped; '|' escaped everywhere."""
    parts = " ".join(str(text).split()).split("`")
    if len(parts) % 2 == 0:  # an unclosed backtick: no code spans
        parts = ["'".join(parts)]
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"([\\<*])", r"\\\1", parts[i])
    return "`".join(parts).replace("|", "\\|")


def has_keys(node) -> bool:
    """Whether a schema holds object keys (`properties`) anywhere in it."""
    if isinstance(node, dict):
        return "properties" in node or any(has_keys(v) for v in node.values())
    if isinstance(node, list):
        return any(has_keys(v) for v in node)
    return False


def _canonical(node) -> str:
    return json.dumps(node, sort_keys=True)


class Reference:
    """The walk over a set of schemas, by file name (refs between them resolve by that name)."""

    def __init__(self, docs: dict[str, dict]):
        self.docs = docs
        # named types: a $def with no keys of its own; one anchor per distinct schema of a name
        self.named: dict[tuple[str, str], str] = {}  # (doc, def) -> anchor
        by_name: dict[str, set[str]] = {}
        for doc in sorted(docs):
            for name, node in docs[doc].get("$defs", {}).items():
                if not has_keys(node):
                    by_name.setdefault(name, set()).add(_canonical(node))
        for doc in sorted(docs):
            for name, node in docs[doc].get("$defs", {}).items():
                if not has_keys(node):
                    stem = doc.split(".")[0]
                    unique = len(by_name[name]) == 1
                    self.named[doc, name] = f"type-{name}" if unique else f"type-{stem}-{name}"

    # --- $ref --------------------------------------------------------------------------------

    def target(self, doc: str, ref: str) -> tuple[str, dict]:
        """The document and node a $ref names ('#/$defs/id', 'arm.schema.yaml#/$defs/hyper')."""
        file, _, pointer = ref.partition("#")
        doc = file or doc
        if doc not in self.docs:
            raise ValueError(f"{ref}: no schema {doc}")
        node = self.docs[doc]
        for part in pointer.strip("/").split("/") if pointer.strip("/") else []:
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return doc, node

    def named_ref(self, doc: str, node: dict) -> str | None:
        """The anchor of the named type a node is a $ref to, else None."""
        ref = node.get("$ref")
        if not isinstance(ref, str):
            return None
        tdoc, _ = self.target(doc, ref)
        m = re.fullmatch(r"[^#]*#/\$defs/([^/]+)", ref)
        return self.named.get((tdoc, m.group(1))) if m else None

    def named_target(self, doc: str, node: dict) -> dict:
        """The $def a node names as a named type, else {}."""
        return self.target(doc, node["$ref"])[1] if self.named_ref(doc, node) else {}

    def expand(self, doc: str, node: dict, seen: tuple = ()) -> tuple[str, dict, tuple]:
        """A node with the $ref chain it starts with inlined (its own keys win), unless that is a
        named type or a ref already being expanded (a cycle); the document its refs resolve in."""
        while isinstance(node.get("$ref"), str) and not self.named_ref(doc, node):
            key = (doc, node["$ref"])
            if key in seen:
                break
            tdoc, target = self.target(doc, node["$ref"])
            node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            doc, seen = tdoc, (*seen, key)
        return doc, node, seen

    # --- types -------------------------------------------------------------------------------

    def type_of(self, doc: str, node, seen: tuple = ()) -> str:
        """A schema's type as a short Markdown phrase."""
        if node is True or node == {}:
            return "any"
        if node is False:
            return "nothing"
        anchor = self.named_ref(doc, node)
        if anchor:
            name = node["$ref"].rsplit("/", 1)[-1]
            return f"[{name}](#{anchor})"
        doc, node, seen = self.expand(doc, node, seen)
        if "$ref" in node:  # a cycle
            return code(node["$ref"])
        if "const" in node:
            return code(yaml_value(node["const"]))
        if "enum" in node:
            values = [code(yaml_value(v)) for v in node["enum"]]
            return values[0] if len(values) == 1 else "one of " + ", ".join(values)
        alts = node.get("oneOf") or node.get("anyOf")
        needs = ""
        if alts and all(set(a) == {"required"} for a in alts):
            one = "exactly one" if "oneOf" in node else "at least one"
            names = ", ".join(code(k) for a in alts for k in a["required"])
            needs, alts = f"; needs {one} of {names}", None
        types = node.get("type")
        if isinstance(types, str):
            types = [types]
        parts = [self._of_type(doc, node, t, seen) for t in types or []]
        if alts and parts:  # a type narrowed by alternatives
            which = "exactly one" if "oneOf" in node else "at least one"
            narrowed = "; ".join(self.type_of(doc, a, seen) for a in alts)
            parts = [f"{' or '.join(parts)} ({which} of: {narrowed})"]
        elif alts:
            parts = [self.type_of(doc, a, seen) for a in alts]
        elif not parts and "then" in node:
            parts = [self.type_of(doc, node[k], seen) for k in ("then", "else") if k in node]
        if not parts and _range(node):  # bounds with no type: what they allow
            parts = [_range(node).strip()]
        if not parts:
            parts = ["object"] if "properties" in node or needs else ["any"]
        return " or ".join(parts) + needs

    def _of_type(self, doc: str, node: dict, t: str, seen: tuple) -> str:
        if t in ("integer", "number"):
            return t + _range(node)
        if t == "string":
            s = "non-empty string" if node.get("minLength") == 1 else "string"
            if node.get("minLength", 0) > 1:
                s += f" of at least {node['minLength']} characters"
            if "maxLength" in node:
                s += f" of at most {node['maxLength']} characters"
            if "pattern" in node:
                s += f" matching {code(node['pattern'])}"
            return s
        if t == "array":
            items = node.get("items")
            s = "list" if items in (None, True, {}) else "list of " + self._plural(doc, items, seen)
            more = []
            if "minItems" in node:
                more.append(f"at least {node['minItems']}")
            if "maxItems" in node:
                more.append(f"at most {node['maxItems']}")
            if node.get("uniqueItems"):
                more.append("unique")
            return ", ".join([s, *more])
        if t == "object":
            values = node.get("additionalProperties")
            if isinstance(values, dict) and not node.get("properties"):
                keys = node.get("propertyNames")
                keys = self.type_of(doc, keys, seen) if keys else "string"
                s = f"map from {_group(keys)} to {_group(self.type_of(doc, values, seen))}"
            else:
                s = "object"
            if "minProperties" in node:
                n = node["minProperties"]
                s += f", at least {n} {'entry' if n == 1 else 'entries'}"
            return s
        return t  # boolean, null

    def _plural(self, doc: str, items, seen: tuple) -> str:
        """A list's item type: a plain type word in the plural, a composite one in brackets."""
        s = self.type_of(doc, items, seen)
        if any(sep in s for sep in (", ", " or ", "; ")):
            return f"({s})"
        return re.sub(r"^((?:non-empty )?(?:string|number|integer|boolean|object))\b", r"\1s", s)

    # --- keys --------------------------------------------------------------------------------

    def keys(self, doc: str, node: dict, prefix: str = "", seen: tuple = ()) -> Iterator[Key]:
        """Every key an object schema reaches, depth first in the schema's order."""
        doc, node, seen = self.expand(doc, node, seen)
        required = set(node.get("required", []))
        for name, prop in (node.get("properties") or {}).items():
            yield from self.key(doc, prop, f"{prefix}{name}", name, name in required, seen)
        for alt in [*node.get("oneOf", []), *node.get("anyOf", []), *node.get("allOf", [])]:
            if isinstance(alt, dict) and set(alt) != {"required"}:
                yield from self.keys(doc, alt, prefix, seen)

    def key(
        self, doc: str, prop, path: str, name: str, required: bool, seen: tuple
    ) -> Iterator[Key]:
        if not isinstance(prop, dict):
            yield Key(path, self.type_of(doc, prop, seen), "", "", False)
            return
        own = prop.get("description")
        edoc, node, eseen = self.expand(doc, prop, seen)
        meaning = own or node.get("description") or self.named_target(doc, prop).get("description")
        shown = "required" if required else ""
        for source in (prop, node, self.named_target(doc, prop)):
            if "default" in source:
                shown = code(yaml_value(source["default"]))
                break
        yield Key(
            path,
            self.type_of(doc, prop, seen),
            shown,
            prose(meaning or ""),
            isinstance(own, str) and bool(own.strip()),
        )
        if self.named_ref(doc, prop):
            return
        yield from self.inside(edoc, node, path, name, eseen)

    def inside(self, doc: str, node: dict, path: str, name: str, seen: tuple) -> Iterator[Key]:
        """The keys under a key: its properties, its map's entries, its list's items."""
        yield from self.keys(doc, node, f"{path}.", seen)
        values = node.get("additionalProperties")
        if isinstance(values, dict) and values:
            entry = f"{path}.<{map_key(name)}>"
            vdoc, vnode, vseen = self.expand(doc, values, seen)
            if vnode.get("description") and not self.named_ref(doc, values):
                yield Key(
                    entry, self.type_of(doc, values, seen), "", prose(vnode["description"]), True
                )
            if not self.named_ref(doc, values):
                yield from self.inside(vdoc, vnode, entry, map_key(name), vseen)
        items = node.get("items")
        if isinstance(items, dict) and not self.named_ref(doc, items):
            idoc, inode, iseen = self.expand(doc, items, seen)
            yield from self.inside(idoc, inode, f"{path}[]", name, iseen)
        for alt in [*node.get("oneOf", []), *node.get("anyOf", [])]:
            if isinstance(alt, dict) and set(alt) != {"required"} and not self.named_ref(doc, alt):
                adoc, anode, aseen = self.expand(doc, alt, seen)
                if "properties" not in anode:  # those keys.keys() walked
                    yield from self.inside(adoc, anode, path, name, aseen)

    def named_types(self) -> Iterator[tuple[str, str, Key]]:
        """(anchor, name, Key) of each named type, once per anchor, by anchor."""
        done = set()
        for (doc, name), anchor in sorted(self.named.items(), key=lambda kv: (kv[1], kv[0])):
            if anchor in done:
                continue
            done.add(anchor)
            node = self.docs[doc]["$defs"][name]
            default = code(yaml_value(node["default"])) if "default" in node else ""
            meaning = prose(node.get("description", ""))
            key = Key(name, self.type_of(doc, {**node}), default, meaning, bool(meaning))
            yield anchor, name, key


def _group(text: str) -> str:
    """A type inside another, bracketed where its commas or alternatives would be ambiguous."""
    return f"({text})" if any(sep in text for sep in (", ", " or ", "; ")) else text


def _range(node: dict) -> str:
    lo = ("[", node["minimum"]) if "minimum" in node else None
    if "exclusiveMinimum" in node:
        lo = ("(", node["exclusiveMinimum"])
    hi = ("]", node["maximum"]) if "maximum" in node else None
    if "exclusiveMaximum" in node:
        hi = (")", node["exclusiveMaximum"])
    if lo and hi:
        return f" in {lo[0]}{lo[1]}, {hi[1]}{hi[0]}"
    if lo:
        return f" {'>=' if lo[0] == '[' else '>'} {lo[1]}"
    if hi:
        return f" {'<=' if hi[0] == ']' else '<'} {hi[1]}"
    return ""
