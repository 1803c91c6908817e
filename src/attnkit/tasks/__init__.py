"""Tasks as registrations: what training for a task means, said once per task (`registry.py`), for the built-in
tasks and for one a user registers from outside the package.

    task       families                          head                  pipeline method   module
    lm         decoder, recurrent-lm, conv-lm,   -                     generate          lm.py
               feedforward-lm
    mlm        encoder                           encoder_head=mlm      fill_mask         lm.py
    translate  encoder-decoder, recurrent-seq2seq -                    translate         translate.py
    classify   encoder                           encoder_head=classify classify          classify.py
    tag        encoder                           encoder_head=tag      tag               tag.py
    chat       decoder                           -                     generate          chat.py
    dpo        decoder                           -                     generate          dpo.py
    reward     decoder                           decoder_head=reward   reward            reward.py
"""

from attnkit.tasks import chat, classify, dpo, lm, reward, tag, translate  # noqa: F401 (each registers its tasks)
from attnkit.tasks.registry import (
    EvalContext,
    HFClass,
    TaskCommand,
    TaskContext,
    TaskSpec,
    TrainingTask,
    own_options,
    register,
    task_names,
    task_of_config,
    task_of_run,
    task_record,
    task_spec,
    tasks,
    tasks_of_family,
    unread_options,
    unregister,
)
from attnkit.tasks.report import EvalReport

__all__ = [
    "EvalContext",
    "EvalReport",
    "HFClass",
    "TaskCommand",
    "TaskContext",
    "TaskSpec",
    "TrainingTask",
    "own_options",
    "register",
    "task_names",
    "task_of_config",
    "task_of_run",
    "task_record",
    "task_spec",
    "tasks",
    "tasks_of_family",
    "unread_options",
    "unregister",
]
