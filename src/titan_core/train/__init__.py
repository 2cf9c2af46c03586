"""The training job: the ``Trainer`` (one method per init step, the step, the loop), the free
functions that build a run's parts from a resolved config (``build``: the model on meta,
converters, parallelization, optimizers), the converter pipeline (``converters``, ``tp_styles``),
the pieces of a step (``token_loss``, ``grad_norm``, ``finite_watch``), the EMA of the weights
(``ema``), the checks made before a
run starts (``preflight``, ``run_limits``, ``memory_estimate``), the dry run's memory plan of a
layout (``memory_plan``, ``activation_probe``, ``target_devices``), the stop on a signal
(``stop_on_signal``) and a whole model on one process for the tools (``whole_model``).

May import every package below it (``plan``, ``weights``, ``hf``, ``boundary``, the components,
``plugin``, ``models``, ``config``, ``runtime``); only ``commands``, ``testing`` and
``fault_tolerance`` import it.
"""
