// One scenario of the Kafka listener's client matrix, run with KafkaJS, unchanged:
//   node scenario.js SCENARIO BOOTSTRAP TOPIC [more...]
// It prints one JSON line with what it saw; tests/kafka/test_kafka_matrix.py decides whether that is
// right (reading the log back over HTTP where it needs to). Exits 1 with the error otherwise.
'use strict'

const { Kafka, logLevel, CompressionTypes } = require('kafkajs')

const [scenario, bootstrap, ...args] = process.argv.slice(2)
const kafka = new Kafka({
  clientId: `matrix-${scenario}`,
  brokers: [bootstrap],
  logLevel: logLevel.NOTHING,
  retry: { retries: 10, initialRetryTime: 100 },
})
const DEADLINE_MS = 30000

const deadline = (what) =>
  new Promise((_, reject) => setTimeout(() => reject(new Error(`timed out: ${what}`)), DEADLINE_MS))

// Read `count` values of a partition from its start (read_committed unless told otherwise).
async function read (topic, partition, count, readUncommitted = false) {
  const consumer = kafka.consumer({ groupId: `reader-${topic}-${Date.now()}`, readUncommitted })
  await consumer.connect()
  const values = []
  await consumer.subscribe({ topics: [topic], fromBeginning: true })
  let done
  const finished = new Promise((resolve) => { done = resolve })
  await consumer.run({
    eachMessage: async ({ partition: p, message }) => {
      if (p === partition) values.push(message.value.toString())
      if (values.length >= count) done()
    },
  })
  await Promise.race([finished, deadline(`reading ${count} values of ${topic}`)])
  await consumer.disconnect()
  return values
}

const scenarios = {
  async idempotent (topic, codec) {
    const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 })
    await producer.connect()
    const compression = codec === 'gzip' ? CompressionTypes.GZIP : CompressionTypes.None
    for (let i = 0; i < 5; i++) {
      await producer.send({ topic, compression, acks: -1, messages: [{ value: `v${i}`, partition: 0 }] })
    }
    await producer.disconnect()
    return {}
  },

  async transactions (topic) {
    const producer = kafka.producer({ transactionalId: `tx-${topic}`, idempotent: true, maxInFlightRequests: 1 })
    await producer.connect()
    for (const [i, commit] of [[0, true], [1, false], [2, true]]) {
      const txn = await producer.transaction()
      await txn.send({ topic, messages: [0, 1].map((j) => ({ value: `${i}-${j}`, partition: 0 })) })
      if (commit) await txn.commit()
      else await txn.abort()
    }
    await producer.disconnect()
    return { committed: await read(topic, 0, 4), all: await read(topic, 0, 6, true) }
  },

  async zombie (topic) {
    const transactionalId = `zombie-${topic}`
    const zombie = kafka.producer({ transactionalId, idempotent: true, maxInFlightRequests: 1 })
    await zombie.connect()
    const stale = await zombie.transaction()
    await stale.send({ topic, messages: [{ value: 'from the zombie', partition: 0 }] })
    const successor = kafka.producer({ transactionalId, idempotent: true, maxInFlightRequests: 1 })
    await successor.connect()
    const txn = await successor.transaction()
    await txn.send({ topic, messages: [{ value: 'from the successor', partition: 0 }] })
    await txn.commit()
    await successor.disconnect()
    let error = null
    try {
      await stale.commit()
    } catch (e) {
      error = e.type || e.name
    }
    await zombie.disconnect().catch(() => {})
    return { error }
  },

  async eos (source, sink, group) {
    const consumer = kafka.consumer({ groupId: group, readUncommitted: false, sessionTimeout: 6000, heartbeatInterval: 500 })
    const producer = kafka.producer({ transactionalId: `eos-${source}`, idempotent: true, maxInFlightRequests: 1 })
    await Promise.all([consumer.connect(), producer.connect()])
    await consumer.subscribe({ topics: [source], fromBeginning: true })
    let processed = 0
    let abortedOnce = false
    let done
    const finished = new Promise((resolve) => { done = resolve })
    await consumer.run({
      autoCommit: false,
      eachBatchAutoResolve: false,
      eachBatch: async ({ batch, resolveOffset }) => {
        if (batch.messages.length === 0) return
        const txn = await producer.transaction()
        await txn.send({
          topic: sink,
          messages: batch.messages.map((m) => ({ value: `${m.value}!`, partition: batch.partition })),
        })
        const last = batch.messages[batch.messages.length - 1]
        await txn.sendOffsets({
          consumerGroupId: group,
          topics: [{ topic: source, partitions: [{ partition: batch.partition, offset: (BigInt(last.offset) + 1n).toString() }] }],
        })
        if (!abortedOnce) {
          // One aborted round: its output never shows, and its input is read again.
          abortedOnce = true
          await txn.abort()
          consumer.seek({ topic: source, partition: batch.partition, offset: batch.messages[0].offset })
          return
        }
        await txn.commit()
        for (const m of batch.messages) resolveOffset(m.offset)
        processed += batch.messages.length
        if (processed >= Number(args[3])) done()
      },
    })
    await Promise.race([finished, deadline(`processing ${args[3]} records`)])
    await consumer.disconnect()
    await producer.disconnect()
    return { processed }
  },

  async group (topic, group) {
    const assignments = {}
    const consumers = [0, 1].map(() => kafka.consumer({ groupId: group, sessionTimeout: 6000, heartbeatInterval: 200, maxWaitTimeInMs: 300 }))
    consumers.forEach((c, i) => {
      c.on(c.events.GROUP_JOIN, (e) => { assignments[i] = (e.payload.memberAssignment[topic] || []).slice().sort() })
    })
    for (const c of consumers) {
      await c.connect()
      await c.subscribe({ topics: [topic] })
      await c.run({ eachMessage: async () => {} })
    }
    const split = async () => {
      const end = Date.now() + DEADLINE_MS
      while (Date.now() < end) {
        const a = assignments[0] || []
        const b = assignments[1] || []
        if (a.length === 2 && b.length === 2 && a.every((p) => !b.includes(p))) return [a, b]
        await new Promise((resolve) => setTimeout(resolve, 100))
      }
      throw new Error(`no split: ${JSON.stringify(assignments)}`)
    }
    const both = await split()
    await consumers[1].disconnect()
    const end = Date.now() + DEADLINE_MS
    while ((assignments[0] || []).length !== 4) {
      if (Date.now() > end) throw new Error(`after leave: ${JSON.stringify(assignments)}`)
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    const alone = assignments[0]
    await consumers[0].disconnect()
    return { both, alone }
  },

  async admin (topic) {
    const admin = kafka.admin()
    await admin.connect()
    const created = await admin.createTopics({
      topics: [{ topic, numPartitions: 3, configEntries: [{ name: 'cleanup.policy', value: 'compact' }] }],
    })
    const listed = (await admin.listTopics()).includes(topic)
    const described = await admin.describeConfigs({
      resources: [{ type: 2, name: topic, configNames: ['cleanup.policy'] }],
      includeSynonyms: false,
    })
    const policy = described.resources[0].configEntries.find((c) => c.configName === 'cleanup.policy').configValue
    const metadata = await admin.fetchTopicMetadata({ topics: [topic] })
    await admin.deleteTopics({ topics: [topic] })
    const after = (await admin.listTopics()).includes(topic)
    await admin.disconnect()
    return { created, listed, policy, partitions: metadata.topics[0].partitions.length, after }
  },
}

scenarios[scenario](...args)
  .then((result) => {
    console.log(JSON.stringify(result))
    process.exit(0)
  })
  .catch((error) => {
    console.error(error && error.stack ? error.stack : String(error))
    process.exit(1)
  })
