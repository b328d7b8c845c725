# The bagpipe worker image, run in Azure by the Container Apps Job of infra/bicep (built
# there with `az acr build`, see docs/deploy.md). It holds the worker, GDAL through the
# rasterio wheels, and the example reductions; scientists add their own programs under
# /opt/bagpipe/reducers (BAGPIPE_REDUCERS_PATH) in an image built FROM this one.

FROM python:3.11-slim-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY reducers reducers
RUN cc -O2 -Wall -Wextra -o reducers/max_composite/max_composite reducers/max_composite/max_composite.c
COPY requirements.txt .
RUN python -m venv /venv && /venv/bin/pip install --no-cache-dir -r requirements.txt

FROM python:3.11-slim-bookworm
ENV PATH=/venv/bin:$PATH PYTHONPATH=/app PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    BAGPIPE_REDUCERS_PATH=/opt/bagpipe/reducers
COPY --from=build /venv /venv
WORKDIR /app
COPY pipeline pipeline
COPY worker worker
COPY bagpipe bagpipe
COPY --from=build /app/reducers reducers
RUN mkdir -p /opt/bagpipe/reducers && useradd --create-home --uid 1000 bagpipe
USER bagpipe
# `docker run IMAGE worker --slots 2 --exit-when-idle 60`: the arguments workers.bicep passes
ENTRYPOINT ["python", "-m", "bagpipe.cli"]
CMD ["worker", "--slots", "2"]
