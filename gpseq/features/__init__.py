"""Token features: spaCy lexical attributes, corpus columns, pipeline attributes, windows,
conjunctions and CRF++ templates → sparse CSR rows, and their padded in-graph form."""

from gpseq.features.config import FeatureConfig, get_preset, list_presets, preset_or_template
from gpseq.features.featurizer import Featurizer
from gpseq.features.lexical import LEXICAL_ATTRIBUTES, char_class
from gpseq.features.matrix import FeatureMatrix
from gpseq.features.padded import PAD_ID, PaddedRows, csr_from_padded, padded_from_csr
from gpseq.features.saved import FORMAT_VERSION
from gpseq.features.templates import FeatureTemplate, parse_crfpp_template

__all__ = [
    "FORMAT_VERSION",
    "FeatureConfig",
    "FeatureMatrix",
    "FeatureTemplate",
    "Featurizer",
    "LEXICAL_ATTRIBUTES",
    "PAD_ID",
    "PaddedRows",
    "char_class",
    "csr_from_padded",
    "get_preset",
    "list_presets",
    "padded_from_csr",
    "parse_crfpp_template",
    "preset_or_template",
]
