"""The `--custom_register_path` file the two-stage recipe and the vanilla export pass to ms-swift (the package's
copy of the repo's custom_model/llama.py): registers `llama3_2_plt`. Importing it again is harmless."""
from swift_plt.plugin.register import register_all

register_all()
