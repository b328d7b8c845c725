"""What ``infra/bicep`` loads as ``names.json``: the storage names of :mod:`pipeline.storage.names`,
the app settings of :mod:`pipeline.settings` and the cache containers' retention
(:func:`pipeline.lifecycle.costs.keep_days`), so that Bicep never retypes a name or a figure.

    python -m pipeline.deployment > infra/bicep/names.json

A test keeps the file equal to this module's answer.
"""

from __future__ import annotations

import json
import sys

from pipeline.lifecycle import costs
from pipeline.settings import Settings, deployed_settings
from pipeline.storage import names

DEPLOYED_SHARDS = 4  # the shard count infra/bicep deploys (BAGPIPE_SHARDS there)


def deployment_names(shards: int = DEPLOYED_SHARDS) -> dict[str, object]:
    """The names of one deployment (an empty namespace), as ``names.json`` holds them."""
    deployed = names.StorageNames()
    return {
        "tables": [deployed.table(t) for t in names.TABLES],
        "queues": deployed.all_queues(shards),
        "taskQueues": [deployed.shard_queue(i) for i in range(shards)],
        "shards": shards,
        # the attempts a message names by default: the workers' queue scaler counts messages
        "tasksPerMessage": Settings.tasks_per_message,
        "containers": [deployed.container(c) for c in names.CONTAINERS],
        "expiringContainers": [deployed.container(c) for c in names.EXPIRING_CONTAINERS],
        "cacheRetention": [{"container": deployed.container(c), "days": keep_days(c)} for c in names.CACHE_CONTAINERS],
        "settings": dict(sorted(deployed_settings().items())),
        "bindingConnection": names.BINDING_CONNECTION,
    }


def keep_days(container: str) -> int:
    """How long the cache ``container`` keeps a blob after its last use (whole days, one at least)."""
    return max(1, round(costs.keep_days(*costs.CACHED[container])))


if __name__ == "__main__":
    json.dump(deployment_names(), sys.stdout, indent=2)
    sys.stdout.write("\n")
