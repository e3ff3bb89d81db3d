"""The family records are the one home of a family (swift_plt/families/): no other product module names a model type,
and every module stays small enough to read (<= 450 lines)."""
import ast
import pathlib

import swift_plt
from swift_plt import families
from swift_plt.critic.families import CRITIC_FAMILIES, NO_CRITIC

PACKAGE = pathlib.Path(swift_plt.__file__).parent


def model_type_names() -> set:
    """Every model type the records and mcore-bridge's classification know: HF, mcore-bridge and critic types."""
    names = set(families.FAMILIES) | set(families.FAMILY_MCORE_TYPES.values()) | set(families.REFUSED)
    names |= set(families.MCORE_REFUSED) | set(families.MCORE_MULTIMODAL_TYPES) | set(families.MCORE_EMBEDDING_TYPES)
    return (names | set(CRITIC_FAMILIES) | set(NO_CRITIC)) - {families.MCORE_GPT_TYPE}


def string_constants(path: pathlib.Path):
    """(line, value) of every string constant of a module that is not a docstring."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and ast.get_docstring(node, clean=False) is not None}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def product_modules():
    return sorted(p for p in PACKAGE.rglob('*.py') if 'families' not in p.relative_to(PACKAGE).parts[:1])


def test_no_module_outside_the_records_names_a_model_type():
    names = model_type_names()
    found = [f'{p.relative_to(PACKAGE)}:{line} {value!r}' for p in product_modules()
             for line, value in string_constants(p)
             if value in names]
    assert not found, 'model types named outside swift_plt/families/ (put the fact in the record): ' + ', '.join(found)


def test_the_check_sees_a_model_type_string(tmp_path):
    """The scan itself: a branch on a type string is found, a docstring that names one is not."""
    module = tmp_path / 'm.py'
    module.write_text('"""qwen3_next in a docstring."""\n\ndef f(t):\n    return t == "qwen3_next"\n')
    assert [v for _, v in string_constants(module) if v in model_type_names()] == ['qwen3_next']


def test_every_product_module_is_at_most_450_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob('*.py')
            if (n := len(p.read_text().splitlines())) > 450}
    assert not long, long


def test_records_are_consistent():
    for t, f in families.FAMILIES.items():
        assert f.hf_type == t
        assert (f.mcore_type == families.MCORE_GPT_TYPE) == (t not in families.FAMILY_MCORE_TYPES), t
        if f.linear_attention or f.text_only_multimodal:
            assert f.mcore_type != families.MCORE_GPT_TYPE, t  # mcore-bridge builds them with their own types
        if f.critic is not None:
            assert f.critic.critic_type.endswith('_critic') and not f.no_critic, t
        assert f.tiny is None or (f.tiny.vision is not None) == f.text_only_multimodal, t
    assert len({f.critic.critic_type for f in families.FAMILIES.values() if f.critic}) == len(CRITIC_FAMILIES)
