"""Project-authored environment classes of the embedded pool, one class per module.

Each module is self-contained (standard library only) so that its source text can be stored in a
pool file as ``class_source`` and executed on its own. That is why every module repeats the same
few small helpers (``_ok``, ``_err``, ``_bad_str``, ``_new_id``) instead of importing them: a
sandboxed environment cannot import this package.
"""
