"""Queue triggers: the planner and the completion handler."""

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

