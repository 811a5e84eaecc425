// evervm from TypeScript in a minute (Node 22.18+ runs .ts files directly):
//   cd examples/node && npm install && node quickstart.ts
//
// Runs the engine in this process (`Client.local()`; EVERVM_HOME chooses where machines live).
// Against a server: `new Client({ url: 'http://127.0.0.1:8080', token })`, or set EVERVM_URL
// and EVERVM_TOKEN and call `new Client()`.
import { Client, NotFoundError, type ExecResult } from 'evervm'

const client = await Client.local()
const machine = await client.createMachine({ tags: { example: 'quickstart' } })

await machine.exec('import statistics\nscores = [71, 88, 93, 65]')
const result: ExecResult = await machine.exec("print('mean computed'); statistics.mean(scores)")
process.stdout.write(result.stdout) // mean computed
console.log('mean:', result.value) // 79.25

for await (const event of machine.stream('for s in sorted(scores):\n    print(s)\nmax(scores)')) {
  if (event.type === 'output') console.log('  line:', event.data)
  else if (event.type === 'result') console.log('  last value:', event.value)
}

// Files go in and out as Buffers (or strings), and persist with the machine.
await machine.files.write('scores.csv', 'score\n71\n88\n93\n65\n')
const mean = await machine.exec("import csv\nstatistics.mean(int(r['score']) for r in csv.DictReader(open('scores.csv')))")
console.log('mean from the file:', mean.value)

// An AbortSignal interrupts a long instruction; the machine keeps its state.
try {
  await machine.exec('import time\ntime.sleep(60)', { signal: AbortSignal.timeout(500) })
} catch (error) {
  console.log('aborted:', (error as Error).name)
}
console.log('still there:', (await machine.exec('len(scores)')).value)

try {
  await client.machine('no-such-machine').exec('1')
} catch (error) {
  if (error instanceof NotFoundError) console.log('as expected:', error.code)
  else throw error
}
await machine.delete()
await client.close()
