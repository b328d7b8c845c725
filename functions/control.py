"""Queue triggers: the planner and the completion handler."""

import azure.functions as func

from functions import runtime
from pipeline import names, sweep

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=names.PLAN_QUEUE, connection=names.BINDING_CONNECTION)
def planner(msg: func.QueueMessage) -> None:
    sweep.handle_plan(runtime.clients(), msg.get_body())


@bp.queue_trigger(arg_name="msg", queue_name=names.DONE_QUEUE, connection=names.BINDING_CONNECTION)
def completion(msg: func.QueueMessage) -> None:
    sweep.handle_done(runtime.clients(), runtime.mailer(), msg.get_body())

