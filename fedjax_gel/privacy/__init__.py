"""Client-level differential privacy: clipping and noising the cohort's updates
(``aggregation``) and accounting for it with Google's ``dp-accounting`` (``accounting``)."""
from fedjax_gel.privacy.accounting import ACCOUNTANTS, Sampling, epsilon, round_event
