"""swift-plt: patch-level training (PLT) for Megatron-SWIFT (ms-swift 4.x).

Importing this package is cheap (no torch): the startup hook ``swift_plt_startup.pth`` imports
``swift_plt.plugin.import_hook`` at interpreter start, which only registers import hooks; the upstream patches in
``swift_plt.plugin.patches`` (the repo's ``swift_plt/plugin/patches/`` folder) are applied when ms-swift's modules are first imported.
"""
__version__ = '0.1.0'

PLT_MODEL_TYPE = 'llama3_2_plt'  # ms-swift model type and mcore-bridge model type
