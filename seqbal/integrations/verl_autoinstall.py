"""Importing this module runs :func:`seqbal.integrations.verl.install`.

It exists for verl's ``VERL_USE_EXTERNAL_MODULES`` hook: verl imports the modules named there
at ``import verl`` in *every* process, including the Ray workers where its engines micro-batch,
which a call in the driver script alone would not reach::

    export VERL_USE_EXTERNAL_MODULES=seqbal.integrations.verl_autoinstall
"""

from seqbal.integrations.verl import install

install()
