"""The node ids of the tests a junit XML report (pytest --junitxml) says were skipped, one
per line: CI's third step runs exactly these again once the extras are installed."""

import sys
import xml.etree.ElementTree as ET

for case in ET.parse(sys.argv[1]).iter("testcase"):
    if case.find("skipped") is None:
        continue
    module, name = case.get("classname", ""), case.get("name", "")
    parts = module.split(".")
    # classname is dotted: tests.pkg.test_mod[.Class]; the file is the longest prefix that is one
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        try:
            open(path).close()
        except OSError:
            continue
        print("::".join([path, *parts[cut:], name]))
        break
