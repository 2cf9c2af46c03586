"""titan-tinygpt: a worked example of a titan-core model plugin (entry point ``tinygpt``).

``model.py`` is the model, ``tp_plan.py`` its tensor-parallel plan, ``validate.py``
checks layouts, ``spec.py`` ties them into the TrainSpec the entry point names.
"""

from .model import TinyGPT, TinyGPTArgs, flops_per_token
from .spec import TinyGPTSection, flavors, tinygpt_spec

__all__ = ["TinyGPT", "TinyGPTArgs", "TinyGPTSection", "flavors", "flops_per_token", "tinygpt_spec"]
