#!/usr/bin/python3
"""Table-driven tests of blazeface_batch.rewrite on small graphs: what it changes, and what it refuses
(anything that could fix the batch and that it does not know how to free). make models-check runs it."""
import os
import sys
import unittest

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import blazeface_batch  # noqa: E402


def graph(nodes, inits, out_shape=(1, 8, 4, 4), extra_inputs=()):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))
    g = helper.make_graph(nodes, "t", [x, *extra_inputs], [y], [numpy_helper.from_array(np.array(v, dtype=np.int64), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])
    m.ir_version = 7
    return m


PAD = graph([helper.make_node("ConstantOfShape", ["s"], ["z"]), helper.make_node("Concat", ["x", "z"], ["y"], axis=1)], {"s": [1, 4, 4, 4]})
RESHAPE = graph([helper.make_node("Reshape", ["x", "s"], ["y"])], {"s": [1, 16, 4]}, out_shape=(1, 16, 4))


class Rewrite(unittest.TestCase):
    def test_rewrites(self):
        for name, model, want_ops, want_counts in (
            ("channel pad", PAD, ["Pad"], {"io": 2, "pad": 1, "reshape": 0, "dropped_initializers": 1}),
            ("reshape", RESHAPE, ["Reshape"], {"io": 2, "pad": 0, "reshape": 1, "dropped_initializers": 0}),
        ):
            with self.subTest(name):
                m = onnx.ModelProto()
                m.CopyFrom(model)
                counts, _ = blazeface_batch.rewrite(m)
                self.assertEqual({k: counts[k] for k in want_counts}, want_counts)
                self.assertEqual([n.op_type for n in m.graph.node], want_ops)
                for v in list(m.graph.input) + list(m.graph.output):
                    self.assertEqual(v.type.tensor_type.shape.dim[0].dim_param, "N")
                onnx.checker.check_model(m, full_check=True)
                if name == "channel pad":
                    pads = {t.name: numpy_helper.to_array(t).tolist() for t in m.graph.initializer}
                    self.assertEqual(list(pads.values()), [[0, 0, 0, 0, 0, 4, 0, 0]])
                else:
                    self.assertEqual(numpy_helper.to_array(m.graph.initializer[0]).tolist(), [0, 16, 4])

    def test_refuses(self):
        shape_in = helper.make_tensor_value_info("s2", TensorProto.INT64, [3])
        for name, model, want in (
            ("concat on another axis", graph([helper.make_node("ConstantOfShape", ["s"], ["z"]), helper.make_node("Concat", ["x", "z"], ["y"], axis=2)], {"s": [1, 4, 4, 4]}), "not the channel padding"),
            ("zeros first", graph([helper.make_node("ConstantOfShape", ["s"], ["z"]), helper.make_node("Concat", ["z", "x"], ["y"], axis=1)], {"s": [1, 4, 4, 4]}), "not the channel padding"),
            ("non-zero fill", graph([helper.make_node("ConstantOfShape", ["s"], ["z"], value=numpy_helper.from_array(np.array([1.0], dtype=np.float32))), helper.make_node("Concat", ["x", "z"], ["y"], axis=1)], {"s": [1, 4, 4, 4]}), "value is not zero"),
            ("reshape not leading with 1", graph([helper.make_node("Reshape", ["x", "s"], ["y"])], {"s": [2, 8, 4]}, out_shape=(1, 16, 4)), "does not lead with the batch 1"),
            ("reshape shape computed", graph([helper.make_node("Cast", ["s"], ["s2"], to=TensorProto.INT64), helper.make_node("Reshape", ["x", "s2"], ["y"])], {"s": [1, 16, 4]}, out_shape=(1, 16, 4)), "is not an initializer"),
            ("extra input without a batch", graph([helper.make_node("Reshape", ["x", "s2"], ["y"])], {}, out_shape=(1, 16, 4), extra_inputs=[shape_in]), "leading dimension 3"),
            ("shape op", graph([helper.make_node("Shape", ["x"], ["y"])], {}, out_shape=(1, 4, 4, 4)), "Shape"),
            ("batch not 1", graph([helper.make_node("Relu", ["x"], ["y"])], {}, out_shape=(2, 4, 4, 4)), "leading dimension 2"),
        ):
            with self.subTest(name), self.assertRaises(SystemExit) as e:
                blazeface_batch.rewrite(model)
            self.assertIn(want, str(e.exception), name)


if __name__ == "__main__":
    unittest.main()
