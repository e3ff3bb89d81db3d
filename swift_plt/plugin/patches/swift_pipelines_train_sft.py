"""ms-swift ``SwiftSft`` (both backends). ``_prepare_template``: hands K (and a critic run's options) to the template.
``_post_process_datasets``: at K > 1, the PLT data report before step 1 (docs/data-report.md).
"""
import functools

from swift_plt.compat.guard import guard
from swift_plt.compat.supported import VERIFIED_STACKS
from swift_plt.compat.versions import check_once
from swift_plt.patch_level.patch_size import patch_size_of

TARGET = 'swift.pipelines.train.sft'
VERIFIED = f'ms-swift 4.6.0 on {VERIFIED_STACKS}'


def apply(module):
    check_once()
    cls = module.SwiftSft
    upstream = guard(cls, '_prepare_template', ['self'], VERIFIED)
    upstream_post = guard(cls, '_post_process_datasets', ['self', 'datasets'], VERIFIED)
    if getattr(upstream, '_swift_plt', False):
        return
    from swift_plt.critic.arguments import is_critic

    @functools.wraps(upstream)
    def _prepare_template(self):
        upstream(self)
        self.template.patch_size = patch_size_of(self.args)  # travels to dataset workers with the template
        if is_critic(self.args) and hasattr(self.args, 'value_clip_range'):  # Megatron-side runs only
            self.template.critic_clipped = getattr(self.args, 'value_clip_range', None) is not None

    _prepare_template._swift_plt = True
    cls._prepare_template = _prepare_template
    apply_data_report(cls, upstream_post)


# ------------------------------------------------------------------------------------------ PLT data report
def apply_data_report(cls, upstream):

    @functools.wraps(upstream)
    def _post_process_datasets(self, datasets):
        k = patch_size_of(self.template)
        if k > 1:
            from swift_plt.data.template_report import plt_data_report
            plt_data_report(self.args, self.template, datasets, k)
        return upstream(self, datasets)

    _post_process_datasets._swift_plt = True
    cls._post_process_datasets = _post_process_datasets
