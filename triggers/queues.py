"""Queue triggers: the planner and the completion handler, and what ends a job whose plan or
done message the host gave up on (its poison queue)."""

import azure.functions as func

from pipeline.lifecycle import sweep
from pipeline.storage import names
from triggers import host

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=names.PLAN_QUEUE, connection=names.BINDING_CONNECTION)
def planner(msg: func.QueueMessage) -> None:
    sweep.handle_plan(host.clients(), msg.get_body())


@bp.queue_trigger(arg_name="msg", queue_name=names.DONE_QUEUE, connection=names.BINDING_CONNECTION)
def completion(msg: func.QueueMessage) -> None:
    sweep.handle_done(host.clients(), host.mailer(), msg.get_body())


POISONED = "poisoned by the Functions host after its retries"


@bp.queue_trigger(arg_name="msg", queue_name=names.PLAN_QUEUE + names.POISON_SUFFIX,
                  connection=names.BINDING_CONNECTION)
def planner_poisoned(msg: func.QueueMessage) -> None:
    sweep.handle_poisoned(host.clients(), host.mailer(), names.PLAN_QUEUE, msg.get_body(), POISONED)


@bp.queue_trigger(arg_name="msg", queue_name=names.DONE_QUEUE + names.POISON_SUFFIX,
                  connection=names.BINDING_CONNECTION)
def completion_poisoned(msg: func.QueueMessage) -> None:
    sweep.handle_poisoned(host.clients(), host.mailer(), names.DONE_QUEUE, msg.get_body(), POISONED)
