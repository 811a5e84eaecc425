// evervm from Swift: a machine that keeps its state, streams its output, takes files, and is
// interrupted when its Task is cancelled. Against a server at EVERVM_URL with EVERVM_TOKEN
// (README.md beside Package.swift says how to start one and how to build this).
import Evervm
import Foundation

let client = try Client.fromEnvironment()
print("signed in as", try await client.whoami())

let machine = try await client.createMachine(tags: ["example": "swift-quickstart"])
print("machine", machine.name())

// State persists between instructions: variables, imports, functions.
_ = try await machine.exec(code: "import statistics\nscores = [71, 88, 93, 65]")
let result = try await machine.exec(code: "print('mean computed')\nstatistics.mean(scores)")
print(result.stdout, terminator: "")  // mean computed
print("mean:", result.value ?? "none")  // 79.25

// Output as it comes, then the result.
for try await event in try machine.events(code: "for s in sorted(scores):\n    print(s)\nmax(scores)") {
    switch event {
    case .output(let chunk): print("  line:", chunk.data)
    case .rich(let rich): print("  rich result:", rich.kind)
    case .finished(let finished): print("  last value:", finished.value ?? "none")
    }
}

// Files go in and out as Data and persist with the machine.
_ = try await machine.writeFile(path: "scores.csv", data: Data("score\n71\n88\n93\n65\n".utf8))
let fromFile = try await machine.exec(
    code: "import csv\nstatistics.mean(int(r['score']) for r in csv.DictReader(open('scores.csv')))")
print("mean from the file:", fromFile.value ?? "none")
let listing = try await machine.listFiles()
print("home holds:", listing.entries.map(\.name))

// A checkpoint, a mistake, and back.
let saved = try await machine.checkpoint(name: "scores-loaded")
_ = try await machine.exec(code: "scores.clear()")
_ = try await machine.rollback(checkpoint: saved.name)
print("after rollback:", try await machine.exec(code: "len(scores)").value ?? "none")  // 4

// Cancelling the Task interrupts the instruction; the machine keeps its state.
let long = Task { try await machine.exec(code: "import time\ntime.sleep(60)") }
try await Task.sleep(nanoseconds: 500_000_000)
long.cancel()
do {
    _ = try await long.value
} catch let error as EvervmError {
    print("cancelled:", error.message)
}
print("still there:", try await machine.exec(code: "len(scores)").value ?? "none")

// A failure in Python is a result with an error, not a thrown error.
let failed = try await machine.exec(code: "1 / 0")
print("error:", failed.error?.split(separator: "\n").last ?? "none")

// Errors from evervm itself are one enum, a case per kind.
do {
    _ = try await client.machine(name: "no-such-machine").exec(code: "1")
} catch EvervmError.NotFound(let message) {
    print("as expected:", message)
}

try await machine.delete()
