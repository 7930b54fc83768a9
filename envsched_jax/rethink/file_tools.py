"""The file tools of a workspace episode: list, read, search, write, submit (standard library only).

This module's source is the ``class_source`` of every workspace environment
(:mod:`envsched_jax.rethink.pool`), so the same class runs in-process and in the jailed sandboxes.
It must therefore import nothing outside the standard library and never raise from a tool: a
tool that raises ends an episode with reward 0 (:mod:`envsched_jax.envs.runtime.core`), while a
wrong call by the agent is an observation it can recover from, returned as
``{"success": False, "error": ...}``.

State (what the rubric checks see as ``final_state``):

- ``files``: path -> ``{"text": str | None, "kind": "text" | "image" | "binary", "modified",
  "size"}``. Images and binary files have ``text`` None: the reading tools cannot see them (the
  paper's image-only withdrawal notice, section 1).
- ``written``: path -> text the agent wrote with :meth:`FileWorkspace.write_file`. Source files
  cannot be overwritten (preparation and agents never modify sources).
- ``answer``: the JSON object given to :meth:`FileWorkspace.submit_answer` (``None`` until then);
  the rubric reads ``final_state["answer"]``.
- ``reads``: the paths the agent read, in order (the read-fidelity record of appendix A.6).
- ``collections`` / ``events``: a prepared environment's Collection Map (collections with their
  cards) and public Event Log, as JSON (section 4.1, "Inputs and execution": the Task Executor
  browses cards and retrieves sessions by file path); ``None`` for an unprepared one, where the
  layer tools say so.
"""

MAX_LINES = 400
MAX_RESULTS = 50
OUTPUT_PREFIX = "output/"


class FileWorkspace:
    """A read-mostly file workspace with an answer slot."""

    def __init__(self):
        self.files = {}
        self.written = {}
        self.answer = None
        self.reads = []
        self.collections = None
        self.events = None

    def list_files(self, directory=""):
        """Files under ``directory`` ("" for all): path, kind, modification time and size."""
        if not isinstance(directory, str):
            return {"success": False, "error": "directory must be a string"}
        prefix = directory.rstrip("/") + "/" if directory else ""
        rows = [{"path": p, "kind": f["kind"], "modified": f["modified"], "size": f["size"]}
                for p, f in sorted(self.files.items()) if p.startswith(prefix)]
        rows += [{"path": p, "kind": "text", "modified": "", "size": len(t.encode("utf-8"))}
                 for p, t in sorted(self.written.items()) if p.startswith(prefix)]
        return {"success": True, "files": rows}

    def read_file(self, path, start_line=1, max_lines=MAX_LINES):
        """Lines ``start_line``.. of a text file (1-based), at most ``max_lines`` of them."""
        if not isinstance(path, str):
            return {"success": False, "error": "path must be a string"}
        if not isinstance(start_line, int) or not isinstance(max_lines, int) or start_line < 1 or max_lines < 1:
            return {"success": False, "error": "start_line and max_lines must be positive integers"}
        if path in self.written:
            text = self.written[path]
        elif path in self.files:
            entry = self.files[path]
            if entry["text"] is None:
                self.reads.append(path)
                return {"success": False, "error": f"{path} is a {entry['kind']} file; the text tools cannot read it"}
            text = entry["text"]
        else:
            return {"success": False, "error": f"no file {path!r}"}
        self.reads.append(path)
        lines = text.splitlines(keepends=True)      # verbatim: line breaks as in the file (CRLF kept)
        chunk = lines[start_line - 1:start_line - 1 + min(max_lines, MAX_LINES)]
        return {"success": True, "path": path, "start_line": start_line, "total_lines": len(lines),
                "text": "".join(chunk)}

    def search_files(self, query, max_results=20):
        """Case-insensitive substring search over the text files: path, line number, line."""
        if not isinstance(query, str) or not query.strip():
            return {"success": False, "error": "query must be a non-empty string"}
        if not isinstance(max_results, int) or max_results < 1:
            return {"success": False, "error": "max_results must be a positive integer"}
        needle = query.lower()
        hits = []
        for path, entry in sorted(self.files.items()):
            if entry["text"] is None:
                continue
            for number, line in enumerate(entry["text"].splitlines(), 1):
                if needle in line.lower():
                    hits.append({"path": path, "line": number, "text": line[:300]})
                    if len(hits) >= min(max_results, MAX_RESULTS):
                        return {"success": True, "hits": hits, "truncated": True}
        return {"success": True, "hits": hits, "truncated": False}

    def write_file(self, path, content):
        """Write an output file under ``output/`` (source files are never overwritten)."""
        if not isinstance(path, str) or not isinstance(content, str):
            return {"success": False, "error": "path and content must be strings"}
        if not path.startswith(OUTPUT_PREFIX) or ".." in path.split("/"):
            return {"success": False, "error": f"outputs go under {OUTPUT_PREFIX!r}; got {path!r}"}
        if path in self.files:
            return {"success": False, "error": f"{path} is a source file; source files cannot be changed"}
        self.written[path] = content
        return {"success": True, "path": path}

    def submit_answer(self, answer):
        """Submit the task's outcome (a JSON object); a later call replaces it."""
        if not isinstance(answer, dict):
            return {"success": False, "error": "answer must be a JSON object"}
        self.answer = answer
        return {"success": True}

    def list_collections(self):
        """The Collection Map: each collection's id, themes and member paths. How a collection
        was formed (its origin and internal name) is not shown: a task-guided group is formed
        from the labels, and saying so would hand the agent the labels."""
        if self.collections is None:
            return {"success": False, "error": "this workspace has no Collection Map"}
        rows = []
        for c in self.collections:
            card = c.get("card") or {}
            rows.append({"collection_id": c["collection_id"], "themes": list(card.get("themes", [])),
                         "members": list(c["members"])})
        return {"success": True, "collections": rows}

    def read_card(self, collection_id):
        """A collection's card: themes, contents, representative evidence, source paths."""
        if self.collections is None:
            return {"success": False, "error": "this workspace has no Collection Map"}
        for c in self.collections:
            if c["collection_id"] == collection_id:
                return {"success": True, "card": c.get("card")}
        return {"success": False, "error": f"no collection {collection_id!r}"}

    def file_history(self, path):
        """The Event Log's sessions touching ``path`` (as input, output, quote or relation end),
        in log order. Every event is synthetic: its quotes are verbatim, its timestamps invented."""
        if self.events is None:
            return {"success": False, "error": "this workspace has no Event Log"}
        if not isinstance(path, str):
            return {"success": False, "error": "path must be a string"}
        hits = []
        for e in self.events:
            relation = e.get("relation") or {}
            touched = (list(e.get("inputs", [])) + list(e.get("outputs", []))
                       + [x.get("path") for x in e.get("excerpts", [])]
                       + [relation.get("source"), relation.get("target")])
            if path in touched:
                hits.append(e)
        return {"success": True, "events": hits}
