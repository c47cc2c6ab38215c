"""placeholder"""
def build(ops, spec, training, segments):
    raise NotImplementedError
