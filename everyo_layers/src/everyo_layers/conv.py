"""(being written)"""

OPS: dict = {}
LAYERS: dict = {}
