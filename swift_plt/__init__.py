"""swift-plt: patch-level training (PLT) for Megatron-SWIFT (ms-swift 4.x).

Importing it is cheap (no torch): ``swift_plt_startup.pth`` registers import hooks (``swift_plt.plugin.import_hook``)
that patch ms-swift's modules when they are first imported.
"""
__version__ = '0.1.0'

PLT_MODEL_TYPE = 'llama3_2_plt'  # ms-swift model type and mcore-bridge model type
