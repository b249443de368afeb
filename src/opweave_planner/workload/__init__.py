"""The decode workload, for the planner and ``afd`` alike: a fixed context, request traces and
parametric length laws, and the stationary decode-context law made from them.

Modules, each importing only those above it:

- ``traces``: the trace formats, declared once (the reader, help texts, errors and docs read them)
- ``spec``: the grammar and the frozen specs (``LengthLaw``, ``FixedContextSpec``, ``TraceSpec``,
  ``LawSpec``), ``is_inline_law``
- ``scan``: the trace reader's numba kernels; ``reader``: ``read_trace`` and its per-process cache
- ``law``: ``ContextLaw``, the stationary decode-context law; ``stationary_moments``,
  ``scenarios``, ``step_percentile``
- ``shaping``: ``max_model_len`` (``fit_requests``), ``scale_ctx``, ``materialize(spec)``
- ``kv``: KV/state bytes and the quantile of their sum over a replica's resident requests
- ``edge``: ``workload_spec``, where ``--ctx``/``--workload`` text becomes a spec
- ``sampling``: the requests the AFD simulator draws (``ParametricWorkload``, ``TraceWorkload``,
  ``LawWorkload``)

Nothing is imported here, so that reading the trace formats for ``--help`` loads neither numpy
nor numba. See docs/workloads.md.
"""
