"""evervm from Python in a minute: `pip install ./bindings-python`, then `python quickstart.py`.

Runs the engine in this process (`Client.local()`; set EVERVM_HOME to choose where machines
live). Against a server: `evervm.Client("http://127.0.0.1:8080", token)`.
"""

import evervm

with evervm.Client.local() as client:
    machine = client.create_machine(tags={"example": "quickstart"})
    machine.exec("import statistics\nscores = [71, 88, 93, 65]")
    result = machine.exec("print('mean computed'); statistics.mean(scores)")
    print(result.stdout, end="")  # mean computed
    print("mean:", result.value)  # 79.25
    for event in machine.stream("for s in sorted(scores):\n    print(s)\nmax(scores)"):
        if isinstance(event, evervm.OutputChunk):
            print("  line:", event.data)
        else:
            print("  last value:", event.value)
    try:
        client.machine("no-such-machine").exec("1")
    except evervm.NotFoundError as error:
        print("as expected:", error)
    machine.delete()
