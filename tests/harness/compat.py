"""Test marks for the transformers range (swift_plt/compat/transformers.py): CI runs the suite on transformers 5.x and 4.57.x."""
import pytest

from swift_plt.compat.transformers import has_bias_free_token_classification

# The value-head critic's HF format (LlamaForTokenClassification with a bias-free head) needs transformers 5.x; on
# 4.57.x swift-plt refuses critic runs (test_hf_compat checks the refusal), so the critic's tests do not apply.
requires_critic_transformers = pytest.mark.skipif(
    not has_bias_free_token_classification(),
    reason='llama3_2_critic needs transformers 5.x (bias-free token-classification head); refused on this version')
