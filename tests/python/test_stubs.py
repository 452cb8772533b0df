"""Each C extension module of the package against its type stub
(python/kvcoord/<module>.pyi): every public name the module has is in the
stub and every name the stub declares is in the module, and so for each
class's own attributes (methods, properties, structseq fields).  A method
added to the C code without its stub line, or a stub line left behind by a
rename, fails here.  Signatures are not checked (METH_VARARGS methods carry
none at run time)."""

import ast
import importlib
import os
import unittest

STUBS = {"kvcoord._kvcoord": "_kvcoord.pyi", "kvcoord._engine": "_engine.pyi"}
# a structseq type's own counts, not fields
STRUCTSEQ = {"n_fields", "n_sequence_fields", "n_unnamed_fields"}


def stub_names(tree):
    """({public name: node}, names bound by imports) at a stub's top level."""
    names, imported = {}, set()
    for n in tree.body:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            imported |= {a.asname or a.name for a in n.names}
        elif isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            names[n.name] = n
        elif isinstance(n, ast.AnnAssign):
            names[n.target.id] = n
        elif isinstance(n, ast.Assign):
            for t in n.targets:
                names[t.id] = n
    return {k: v for k, v in names.items() if not k.startswith("_")}, imported


class StubsMatchModules(unittest.TestCase):
    def check(self, modname, stub):
        mod = importlib.import_module(modname)
        pkg = os.path.dirname(mod.__file__)
        with open(os.path.join(pkg, stub), encoding="utf-8") as f:
            names, imported = stub_names(ast.parse(f.read()))
        real = {k for k in dir(mod) if not k.startswith("_")}
        self.assertEqual(sorted(set(names) - real), [], "in %s, not in %s" % (stub, modname))
        self.assertEqual(sorted(real - set(names) - imported), [],
                         "in %s, not in %s" % (modname, stub))
        for name, node in names.items():
            if not isinstance(node, ast.ClassDef):
                continue
            cls = getattr(mod, name)
            defs = {b.name for b in node.body if isinstance(b, ast.FunctionDef)}
            anns = {b.target.id for b in node.body if isinstance(b, ast.AnnAssign)}
            own = {a for a in vars(cls) if not a.startswith("_")} - STRUCTSEQ
            self.assertEqual(sorted(own - defs - anns), [],
                             "%s.%s's own, not in %s" % (modname, name, stub))
            self.assertEqual(sorted(d for d in defs if not d.startswith("_")
                                    and not hasattr(cls, d)), [],
                             "in %s's %s, not in %s" % (stub, name, modname))

    def test_kvcoord(self):
        self.check("kvcoord._kvcoord", STUBS["kvcoord._kvcoord"])

    def test_engine(self):
        self.check("kvcoord._engine", STUBS["kvcoord._engine"])

    def test_every_extension_has_a_stub(self):
        import kvcoord
        pkg = os.path.dirname(kvcoord.__file__)
        exts = {f.split(".")[0] for f in os.listdir(pkg) if f.endswith(".so")}
        self.assertEqual(sorted("kvcoord." + e for e in exts), sorted(STUBS))


if __name__ == "__main__":
    unittest.main()
