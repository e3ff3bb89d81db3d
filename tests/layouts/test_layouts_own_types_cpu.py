"""PLT at K=4 on the decoders mcore-bridge builds with their own layer spec, attention or bridge (olmoe, glm4,
minimax_m2, hy_v3, bailing_moe) and on GPT-OSS (attention sinks, a sliding window over patches), in ms-swift's
Megatron training step on CPU: TP=2 with sequence parallel on packed (THD) rows equals one rank (loss and every
gradient). Their attention splits over TP where the `gpt` families' does not (QK-norm over all heads' channels,
Ling's fused QKV regrouped per query group, the sinks per head), and TP=2 splits their experts too. (Every gradient
against the family's HF model: tests/models/test_families_cpu.py.)"""
import pytest

from harness.bailing_moe import make_tiny
from harness.dist import spawn
from swift_plt.compat.transformers import transformers_version
from swift_plt.families import FAMILY_MCORE_TYPES, MCORE_GPT_TYPE, OWN_MCORE_TYPES, plt_mcore_type
from test_layouts_cpu import K, VOCAB, _step, assert_same_step, make_micro_batches, pack

# the Megatron side under test does not depend on the transformers version: the 5.x tier runs it (on 4.57 two of the
# six cannot be built at all)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(transformers_version() < (5, ), reason='run in the transformers 5.x tier')]

FAMILIES = [*OWN_MCORE_TYPES, 'gpt_oss']
NO_AUX = {'moe_aux_loss_coeff': 0.0}


@pytest.mark.parametrize('family', FAMILIES)
def test_own_type_packed_tp2_sp_equals_one_rank(family, tmp_path):
    hf_dir = make_tiny(family, str(tmp_path), vocab_size=VOCAB)
    plt_type = plt_mcore_type(FAMILY_MCORE_TYPES.get(family, MCORE_GPT_TYPE))
    batches = pack(make_micro_batches())
    one = spawn(_step, 1, hf_dir, plt_type, K, batches, None, False, None, NO_AUX)
    # megatron-core takes biased experts (GPT-OSS) only with expert tensor parallel 1: its experts split over EP=2
    dims = dict(tp=2, ep=2, etp=1) if family == 'gpt_oss' else dict(tp=2)
    tp2 = spawn(_step, 2, hf_dir, plt_type, K, batches, None, True, None, NO_AUX, **dims)
    assert_same_step(tp2, one, f'{family} PLT K={K} packed TP2+SP')
