"""The web app: the request API, the portal, the STAC API, and who may call them (``auth``,
``identity``, ``entra``, ``audit``)."""
