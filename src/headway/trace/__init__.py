"""Request traces: read public and user trace files, describe them, and (later) fit them.

:mod:`headway.trace.readers` turns Azure LLM inference CSVs, Mooncake JSON Lines and
headway's own generic CSV / JSONL into :class:`headway.core.trace_data.TraceData`;
:mod:`headway.trace.stats` computes the summary statistics that ``headway trace stats``
prints; :mod:`headway.trace.commands` holds the ``headway trace`` verbs.
"""
