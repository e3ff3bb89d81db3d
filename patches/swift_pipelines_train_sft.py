"""ms-swift ``swift.pipelines.train.sft.SwiftSft._prepare_template`` (MegatronSft / MegatronPretrain inherit it):
hand the effective patch size to the template, which pads each encoded document to a multiple of K
(see swift_template). The template travels to dataset workers with its attributes."""
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

    @functools.wraps(upstream)
    def _prepare_template(self):
        upstream(self)
        self.template.plt_patch_size = getattr(self.args, 'patch_size', None) or 1

    _prepare_template._swift_plt = True
    cls._prepare_template = _prepare_template
