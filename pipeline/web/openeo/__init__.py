"""The openEO API (1.2, with 1.3's job timestamps) over bagpipe: openEO's clients (Python, R,
JavaScript, QGIS) connect to ``/openeo/1.2/``, sign in, list the MODIS products and the
processes bagpipe runs, and run process graphs as bagpipe jobs. ``routes`` holds the routes,
``graph`` compiles a process graph onto a request, ``store`` keeps openEO's jobs."""
