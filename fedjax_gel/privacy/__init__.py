"""Client-level differential privacy: private aggregation, and accounting with ``dp-accounting``.

Clipping and noising the cohort's updates (``aggregation``), any delta-uploading algorithm made
private (``dp``: ``private`` with ``Privacy`` settings), and accounting with Google's
``dp-accounting`` (``accounting``: ``round_event``, ``epsilon``, ``Composition``).
"""
from fedjax_gel.privacy.accounting import (ACCOUNTANTS, Composition, Sampling, epsilon,
                                           round_event)
from fedjax_gel.privacy.aggregation import AdaptiveClip
from fedjax_gel.privacy.dp import Privacy, private

__all__ = ['ACCOUNTANTS', 'AdaptiveClip', 'Composition', 'Privacy', 'Sampling', 'epsilon',
           'private', 'round_event']
