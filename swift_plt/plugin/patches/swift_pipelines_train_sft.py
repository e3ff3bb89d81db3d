"""ms-swift ``swift.pipelines.train.sft.SwiftSft`` (MegatronSft / MegatronPretrain inherit it):

* ``_prepare_template``: hand the effective patch size to the template, which pads each encoded document to a
  multiple of K (see swift_template), and, for a critic run (swift_plt.critic), whether rows carry old values (None:
  not a critic, the template does nothing extra). The template travels to dataset workers with its attributes.
* ``_post_process_datasets`` (both backends; it receives the loaded train/val data sets right before ms-swift wraps
  them for lazy encoding / packing / streaming): at K > 1, the PLT data report (swift_plt.data.report): the first
  documents of each data set (all up to SWIFT_PLT_REPORT_DOCS, default 1,000, else that many evenly spaced; streaming:
  the first 1,000) encoded by the
  run's template at K=1 and at K, printed before step 1, kept as OUTPUT_DIR/plt_data_report.json; a train set in
  which no document carries a loss is refused, a low effective fraction warned about. K=1: upstream, untouched.
"""
import functools

from swift_plt.compat.guard import check_once, guard
from swift_plt.patch_level.patch_size import patch_size_of

TARGET = 'swift.pipelines.train.sft'
VERIFIED = 'ms-swift 4.6.0'


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
        self.template.patch_size = patch_size_of(self.args)
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
