"""The scale model: a discrete-event simulation of bagpipe's storage calls (``model``,
``core``, ``worker``, the call table ``calltable``), its calibration on the local stack
(``scale_calibrate``, ``scale_local``) and its prediction on Azure (``azure``,
``scale_azure``). ``bench.scale`` runs its parts with the measured ones."""
