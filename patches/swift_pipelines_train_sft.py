"""ms-swift ``swift.pipelines.train.sft.SwiftSft._prepare_template`` (MegatronSft / MegatronPretrain inherit it):
hand the effective patch size to the template, which pads each encoded document to a multiple of K
(see swift_template), and, for a critic run (swift_plt.critic), whether rows carry old values (None: not a critic,
the template does nothing extra). The template travels to dataset workers with its attributes."""
import functools

from ._guard import check_once, guard

TARGET = 'swift.pipelines.train.sft'
VERIFIED = 'ms-swift 4.6.0'


def apply(module):
    check_once()
    cls = module.SwiftSft
    upstream = guard(cls, '_prepare_template', ['self'], VERIFIED)
    if getattr(upstream, '_swift_plt', False):
        return
    from swift_plt.critic.arguments import is_critic

    @functools.wraps(upstream)
    def _prepare_template(self):
        upstream(self)
        self.template.plt_patch_size = getattr(self.args, 'patch_size', None) or 1
        if is_critic(self.args) and hasattr(self.args, 'value_clip_range'):  # Megatron-side runs only
            self.template.critic_clipped = getattr(self.args, 'value_clip_range', None) is not None

    _prepare_template._swift_plt = True
    cls._prepare_template = _prepare_template
