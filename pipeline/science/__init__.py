"""The computational core of grouped reductions, with no storage and no lifecycle in it:
``groups`` (dates into groups in time) and ``encoding`` (stored values to physical ones and
back)."""
