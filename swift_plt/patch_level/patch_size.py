"""The patch size K of a run, resolved in one place: ``--patch_size``, else ``patch_size`` of the HF config, else 1."""


def resolve_patch_size(cli_value=None, hf_config=None):
    """K from the command line (it wins), else from the HF config (config.json), else 1; not validated here."""
    if cli_value is not None:
        return cli_value
    return int(getattr(hf_config, 'patch_size', None) or 1)


def patch_size_of(obj) -> int:
    """The resolved K that run arguments, a model config or a template carry (1 where none is set)."""
    return getattr(obj, 'patch_size', None) or 1
