"""The computational core of grouped reductions, with no storage and no lifecycle in it:
``groups`` (dates into groups in time), ``encoding`` (stored values to physical ones and
back), ``builtins`` (the built-in reducers on numpy, whole-stack and streaming, and
climatologies) and ``expressions`` (a small safe expression language over inputs); and
``rasters``, the target tiles they read and write."""
