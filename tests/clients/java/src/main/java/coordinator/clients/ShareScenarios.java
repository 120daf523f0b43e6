package coordinator.clients;

import static coordinator.clients.ScenarioRunner.check;
import static coordinator.clients.ScenarioRunner.describe;
import static coordinator.clients.ScenarioRunner.unique;

import coordinator.clients.ScenarioRunner.Scenario;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.ListGroupsOptions;
import org.apache.kafka.clients.admin.ListShareGroupOffsetsSpec;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.SharePartitionOffsetInfo;
import org.apache.kafka.clients.admin.ShareGroupDescription;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.GroupType;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.GroupIdNotFoundException;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * Kafka's share consumer (KIP-932, KafkaShareConsumer) and the Admin client's share-group calls,
 * unchanged, against one broker, the same way Scenarios runs the other clients: Usage:
 * ShareScenarios BOOTSTRAP [SCENARIO...] (none: every one), one line of JSON per scenario,
 * {"scenario": NAME, "ok": BOOL, "detail": TEXT}.
 *
 * Two more modes serve the test that kills a consumer holding records:
 * ShareScenarios BOOTSTRAP hold GROUP TOPIC COUNT acquires COUNT records without acknowledging
 * them, prints {"held": ["PARTITION@OFFSET"...]} and waits to be killed; ShareScenarios BOOTSTRAP
 * drain GROUP TOPIC COUNT accepts records until COUNT distinct ones were accepted, and prints
 * {"accepted": {"PARTITION@OFFSET": DELIVERY_COUNT...}, "twice": N} (N: records it got twice).
 */
public final class ShareScenarios {
    private static final Duration DEADLINE = Duration.ofSeconds(45);
    private final String bootstrap;

    private ShareScenarios(String bootstrap) {
        this.bootstrap = bootstrap;
    }

    public static void main(String[] args) throws Exception {
        ShareScenarios s = new ShareScenarios(args[0]);
        if (args.length > 1 && (args[1].equals("hold") || args[1].equals("drain"))) {
            String group = args[2];
            String topic = args[3];
            int count = Integer.parseInt(args[4]);
            if (args[1].equals("hold")) {
                s.hold(group, topic, count);
            } else {
                s.drain(group, topic, count);
            }
            System.exit(0);
        }
        Map<String, Scenario> all = new LinkedHashMap<>();
        all.put("share_explicit", s::explicitAcknowledgement);
        all.put("share_implicit", s::implicitAcknowledgement);
        all.put("share_reject_and_limit", s::rejectAndDeliveryLimit);
        all.put("share_read_committed", s::readCommitted);
        all.put("share_admin", s::adminCalls);
        ScenarioRunner.runAll(all, List.of(args).subList(1, args.length), DEADLINE);
    }

    // -- clients ---------------------------------------------------------------------------------

    private Admin admin() {
        return ScenarioRunner.admin(bootstrap, DEADLINE);
    }

    private KafkaProducer<String, String> producer(Map<String, Object> extra) {
        return ScenarioRunner.producer(bootstrap, DEADLINE, extra);
    }

    private KafkaShareConsumer<String, String> shareConsumer(String group, String mode) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, mode);
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 10);
        return new KafkaShareConsumer<>(p);
    }

    /** The topic, made with `partitions`, and the group set to read it from its start (and the
     * other group configs given). */
    private void prepare(Admin admin, String topic, int partitions, String group, Map<String, String> configs) throws Exception {
        admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
        Map<String, String> all = new HashMap<>(configs);
        all.putIfAbsent("share.auto.offset.reset", "earliest");
        List<AlterConfigOp> ops = new ArrayList<>();
        for (Map.Entry<String, String> e : all.entrySet()) {
            ops.add(new AlterConfigOp(new ConfigEntry(e.getKey(), e.getValue()), AlterConfigOp.OpType.SET));
        }
        admin.incrementalAlterConfigs(Map.of(new ConfigResource(ConfigResource.Type.GROUP, group), ops)).all().get();
    }

    private List<String> produce(String topic, int partitions, int count, String prefix) {
        List<String> sent = new ArrayList<>();
        try (KafkaProducer<String, String> p = producer(Map.of(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true))) {
            for (int i = 0; i < count; i++) {
                p.send(new ProducerRecord<>(topic, i % partitions, "k" + i, prefix + i));
                sent.add(prefix + i);
            }
            p.flush();
        }
        return sent;
    }

    private static String at(ConsumerRecord<?, ?> r) {
        return r.partition() + "@" + r.offset();
    }

    private static int deliveries(ConsumerRecord<?, ?> r) {
        Optional<Short> count = r.deliveryCount();
        return count.map(Short::intValue).orElse(-1);
    }

    // -- scenarios -------------------------------------------------------------------------------

    /** Two consumers, explicit acknowledgement: whichever gets a record first releases it, so the
     * group delivers it again; in the end every record is accepted exactly once, at a delivery
     * count of at least 2. */
    String explicitAcknowledgement() throws Exception {
        String topic = unique("java-share");
        String group = unique("java-share-group");
        int count = 60;
        try (Admin admin = admin()) {
            prepare(admin, topic, 3, group, Map.of());
        }
        Map<String, Integer> accepted = new ConcurrentHashMap<>();
        Set<String> released = ConcurrentHashMap.newKeySet();
        Map<String, Integer> acceptedAt = new ConcurrentHashMap<>();
        AtomicBoolean failed = new AtomicBoolean();
        List<Thread> threads = new ArrayList<>();
        List<String> errors = new ArrayList<>();
        long deadline = System.nanoTime() + DEADLINE.toNanos();
        for (int c = 0; c < 2; c++) {
            Thread t = new Thread(() -> {
                try (KafkaShareConsumer<String, String> consumer = shareConsumer(group, "explicit")) {
                    consumer.subscribe(List.of(topic));
                    while (accepted.size() < count && System.nanoTime() < deadline && !failed.get()) {
                        ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                        for (ConsumerRecord<String, String> r : records) {
                            if (released.add(r.value())) {
                                consumer.acknowledge(r, AcknowledgeType.RELEASE);
                                continue;
                            }
                            acceptedAt.put(r.value(), deliveries(r));
                            accepted.merge(r.value(), 1, Integer::sum);
                            consumer.acknowledge(r, AcknowledgeType.ACCEPT);
                        }
                        if (!records.isEmpty()) {
                            consumer.commitSync();
                        }
                    }
                } catch (RuntimeException e) {
                    failed.set(true);
                    synchronized (errors) {
                        errors.add(describe(e));
                    }
                }
            });
            t.start();
            threads.add(t);
        }
        // Produced once both consumers are members with partitions.
        try (Admin admin = admin()) {
            long until = System.nanoTime() + DEADLINE.toNanos();
            while (true) {
                check(System.nanoTime() < until, "the two consumers never both had partitions");
                try {
                    ShareGroupDescription d = admin.describeShareGroups(List.of(group)).describedGroups().get(group).get();
                    if (d.members().size() == 2 && d.members().stream().allMatch(m -> !m.assignment().topicPartitions().isEmpty())) {
                        break;
                    }
                } catch (ExecutionException e) {
                    check(e.getCause() instanceof GroupIdNotFoundException, "describe: " + describe(e));
                }
                Thread.sleep(100);
            }
        }
        List<String> sent = produce(topic, 3, count, "v");
        for (Thread t : threads) {
            t.join();
        }
        check(errors.isEmpty(), "consumers failed: " + errors);
        check(accepted.keySet().equals(new HashSet<>(sent)), "accepted " + accepted.size() + " of " + count + ": " + new TreeMap<>(accepted));
        List<String> twice = accepted.entrySet().stream().filter(e -> e.getValue() != 1).map(Map.Entry::getKey).toList();
        check(twice.isEmpty(), "accepted more than once: " + twice);
        List<String> early = acceptedAt.entrySet().stream().filter(e -> e.getValue() < 2).map(Map.Entry::getKey).toList();
        check(early.isEmpty(), "released once, yet accepted at delivery count 1: " + early);
        try (Admin admin = admin()) {
            // Every record accepted: nothing left to process.
            Map<TopicPartition, SharePartitionOffsetInfo> offsets = admin.listShareGroupOffsets(Map.of(group, new ListShareGroupOffsetsSpec()))
                .partitionsToOffsetInfo(group).get();
            check(offsets.size() == 3 && offsets.values().stream().allMatch(o -> o.lag().orElse(-1L) == 0),
                "every record accepted, yet the lag is " + offsets);
        }
        return count + " records, each released once and delivered again, accepted once each by 2 consumers";
    }

    /** Implicit acknowledgement: what poll returned is accepted at the next poll or commit. */
    String implicitAcknowledgement() throws Exception {
        String topic = unique("java-share-implicit");
        String group = unique("java-share-implicit-group");
        int count = 30;
        try (Admin admin = admin()) {
            prepare(admin, topic, 2, group, Map.of());
        }
        List<String> sent = produce(topic, 2, count, "i");
        List<String> got = new ArrayList<>();
        try (KafkaShareConsumer<String, String> consumer = shareConsumer(group, "implicit")) {
            consumer.subscribe(List.of(topic));
            long deadline = System.nanoTime() + DEADLINE.toNanos();
            while (got.size() < count) {
                check(System.nanoTime() < deadline, "got " + got.size() + " of " + count);
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    check(deliveries(r) == 1, at(r) + " delivered " + deliveries(r) + " times");
                    got.add(r.value());
                }
                consumer.commitSync();
            }
        }
        check(new HashSet<>(got).equals(new HashSet<>(sent)) && got.size() == count, "got " + got);
        // A second consumer of the group finds nothing left: all of it was accepted.
        try (KafkaShareConsumer<String, String> again = shareConsumer(group, "implicit")) {
            again.subscribe(List.of(topic));
            long until = System.nanoTime() + Duration.ofSeconds(3).toNanos();
            while (System.nanoTime() < until) {
                ConsumerRecords<String, String> records = again.poll(Duration.ofMillis(200));
                check(records.isEmpty(), "delivered again after being accepted: " + records.count());
            }
        }
        return count + " records, each delivered once, none again to the next consumer";
    }

    /** REJECT archives a record at once; RELEASE returns it until the delivery limit, where it is
     * archived too. */
    String rejectAndDeliveryLimit() throws Exception {
        String topic = unique("java-share-limit");
        String group = unique("java-share-limit-group");
        try (Admin admin = admin()) {
            prepare(admin, topic, 1, group, Map.of("share.delivery.count.limit", "2"));
        }
        produce(topic, 1, 6, "r");
        Map<Long, Integer> seen = new TreeMap<>();
        Set<Long> acceptedOffsets = new HashSet<>();
        try (KafkaShareConsumer<String, String> consumer = shareConsumer(group, "explicit")) {
            consumer.subscribe(List.of(topic));
            long deadline = System.nanoTime() + Duration.ofSeconds(20).toNanos();
            long quietSince = Long.MAX_VALUE / 2; // from the first record on
            // Offsets 0 and 1 are rejected, 2 and 3 always released, 4 and 5 accepted.
            while (System.nanoTime() < deadline && System.nanoTime() - Math.min(quietSince, System.nanoTime()) < Duration.ofSeconds(3).toNanos()) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                for (ConsumerRecord<String, String> r : records) {
                    quietSince = System.nanoTime();
                    seen.merge(r.offset(), 1, Integer::sum);
                    AcknowledgeType type = r.offset() < 2 ? AcknowledgeType.REJECT
                        : r.offset() < 4 ? AcknowledgeType.RELEASE : AcknowledgeType.ACCEPT;
                    if (type == AcknowledgeType.ACCEPT) {
                        acceptedOffsets.add(r.offset());
                    }
                    consumer.acknowledge(r, type);
                }
                if (!records.isEmpty()) {
                    consumer.commitSync();
                }
            }
        }
        check(seen.equals(Map.of(0L, 1, 1L, 1, 2L, 2, 3L, 2, 4L, 1, 5L, 1)), "deliveries by offset " + seen);
        try (Admin admin = admin()) {
            Map<TopicPartition, SharePartitionOffsetInfo> offsets = admin.listShareGroupOffsets(Map.of(group, new ListShareGroupOffsetsSpec()))
                .partitionsToOffsetInfo(group).get();
            Optional<Long> lag = offsets.get(new TopicPartition(topic, 0)).lag();
            check(lag.orElse(-1L) == 0, "lag " + lag + " once every record is accepted or archived: " + offsets);
        }
        return "rejected once, released twice to the limit of 2, then archived: " + seen;
    }

    /** share.isolation.level=read_committed: aborted records are never delivered. */
    String readCommitted() throws Exception {
        String topic = unique("java-share-rc");
        String group = unique("java-share-rc-group");
        try (Admin admin = admin()) {
            prepare(admin, topic, 1, group, Map.of("share.isolation.level", "read_committed"));
        }
        List<String> committed = new ArrayList<>();
        try (KafkaProducer<String, String> p = producer(Map.of(ProducerConfig.TRANSACTIONAL_ID_CONFIG, topic))) {
            p.initTransactions();
            for (int round = 0; round < 3; round++) {
                p.beginTransaction();
                for (int i = 0; i < 5; i++) {
                    String value = (round == 1 ? "aborted-" : "committed-") + round + "-" + i;
                    p.send(new ProducerRecord<>(topic, 0, null, value));
                    if (round != 1) {
                        committed.add(value);
                    }
                }
                if (round == 1) {
                    p.flush();
                    p.abortTransaction();
                } else {
                    p.commitTransaction();
                }
            }
        }
        List<String> got = new ArrayList<>();
        try (KafkaShareConsumer<String, String> consumer = shareConsumer(group, "implicit")) {
            consumer.subscribe(List.of(topic));
            long deadline = System.nanoTime() + DEADLINE.toNanos();
            while (got.size() < committed.size()) {
                check(System.nanoTime() < deadline, "got " + got);
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    got.add(r.value());
                }
            }
            long until = System.nanoTime() + Duration.ofSeconds(2).toNanos();
            while (System.nanoTime() < until) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    got.add(r.value());
                }
            }
        }
        check(got.equals(committed), "read_committed share consumer got " + got);
        return "10 committed records, none of the 5 aborted";
    }

    /** The Admin client's share-group calls: list, describe, offsets listed, reset, deleted, and
     * the group deleted. */
    String adminCalls() throws Exception {
        String topic = unique("java-share-admin");
        String group = unique("java-share-admin-group");
        try (Admin admin = admin()) {
            prepare(admin, topic, 2, group, Map.of());
            produce(topic, 2, 10, "a");
            try (KafkaShareConsumer<String, String> consumer = shareConsumer(group, "implicit")) {
                consumer.subscribe(List.of(topic));
                int got = 0;
                long deadline = System.nanoTime() + DEADLINE.toNanos();
                while (got < 10) {
                    check(System.nanoTime() < deadline, "got " + got + " of 10");
                    got += consumer.poll(Duration.ofMillis(200)).count();
                }
                consumer.commitSync();
                ShareGroupDescription d = admin.describeShareGroups(List.of(group)).describedGroups().get(group).get();
                check(d.groupState() == GroupState.STABLE, "state " + d.groupState());
                check(d.members().size() == 1, "members " + d.members());
                check(d.members().iterator().next().assignment().topicPartitions().size() == 2,
                    "assignment " + d.members().iterator().next().assignment());
                Collection<GroupListing> listed = admin.listGroups(ListGroupsOptions.forShareGroups()).all().get();
                check(listed.stream().anyMatch(g -> g.groupId().equals(group) && g.type().orElse(null) == GroupType.SHARE),
                    "not listed as a share group: " + listed);
            }
            // The consumer closed: the group is empty, and its offsets may be reset.
            TopicPartition p0 = new TopicPartition(topic, 0);
            TopicPartition p1 = new TopicPartition(topic, 1);
            Map<TopicPartition, SharePartitionOffsetInfo> offsets = admin.listShareGroupOffsets(Map.of(group, new ListShareGroupOffsetsSpec()))
                .partitionsToOffsetInfo(group).get();
            System.err.println("offsets before the reset " + offsets);
            check(offsets.get(p0).lag().orElse(-1L) == 0 && offsets.get(p1).lag().orElse(-1L) == 0, "offsets " + offsets);
            admin.alterShareGroupOffsets(group, Map.of(p0, 2L)).all().get();
            offsets = admin.listShareGroupOffsets(Map.of(group, new ListShareGroupOffsetsSpec())).partitionsToOffsetInfo(group).get();
            check(offsets.get(p0).startOffset() == 2 && offsets.get(p0).lag().orElse(-1L) == 3, "reset to 2, yet " + offsets);
            List<Long> again = new ArrayList<>();
            try (KafkaShareConsumer<String, String> consumer = shareConsumer(group, "implicit")) {
                consumer.subscribe(List.of(topic));
                long deadline = System.nanoTime() + DEADLINE.toNanos();
                while (again.size() < 3) {
                    check(System.nanoTime() < deadline, "after the reset got " + again);
                    for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                        check(r.partition() == 0, "after the reset, a record of partition " + r.partition());
                        again.add(r.offset());
                    }
                }
                consumer.commitSync();
            }
            check(new HashSet<>(again).equals(Set.of(2L, 3L, 4L)), "after the reset to 2: " + again);
            admin.deleteShareGroupOffsets(group, Set.of(topic)).all().get();
            offsets = admin.listShareGroupOffsets(Map.of(group, new ListShareGroupOffsetsSpec())).partitionsToOffsetInfo(group).get();
            check(offsets.isEmpty() || offsets.values().stream().allMatch(o -> o == null),
                "offsets left after their deletion: " + offsets);
            admin.deleteShareGroups(List.of(group)).all().get();
            Collection<GroupListing> listed = admin.listGroups(ListGroupsOptions.forShareGroups()).all().get();
            check(listed.stream().noneMatch(g -> g.groupId().equals(group)), "still listed after its deletion: " + listed);
        }
        return "described Stable with 1 member on 2 partitions, listed, offsets reset to 2 and redelivered, deleted";
    }

    // -- the kill test's two halves --------------------------------------------------------------

    void hold(String group, String topic, int count) throws Exception {
        KafkaShareConsumer<String, String> consumer = shareConsumer(group, "explicit");
        consumer.subscribe(List.of(topic));
        List<String> held = new ArrayList<>();
        long deadline = System.nanoTime() + DEADLINE.toNanos();
        while (held.size() < count && System.nanoTime() < deadline) {
            for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                held.add(Json.quote(at(r)));
            }
        }
        System.out.println("{\"held\": [" + String.join(", ", held) + "]}");
        System.out.flush();
        Thread.sleep(Long.MAX_VALUE); // killed here, holding every record it was given
    }

    void drain(String group, String topic, int count) throws Exception {
        Map<String, Integer> accepted = new TreeMap<>();
        int twice = 0;
        try (KafkaShareConsumer<String, String> consumer = shareConsumer(group, "explicit")) {
            consumer.subscribe(List.of(topic));
            long deadline = System.nanoTime() + Duration.ofSeconds(90).toNanos();
            while (accepted.size() < count && System.nanoTime() < deadline) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                for (ConsumerRecord<String, String> r : records) {
                    if (accepted.put(at(r), deliveries(r)) != null) {
                        twice++;
                    }
                    consumer.acknowledge(r, AcknowledgeType.ACCEPT);
                }
                if (!records.isEmpty()) {
                    consumer.commitSync();
                }
            }
        }
        StringBuilder out = new StringBuilder("{\"accepted\": {");
        boolean first = true;
        for (Map.Entry<String, Integer> e : accepted.entrySet()) {
            out.append(first ? "" : ", ").append(Json.quote(e.getKey())).append(": ").append(e.getValue());
            first = false;
        }
        System.out.println(out.append("}, \"twice\": ").append(twice).append('}'));
        System.out.flush();
    }
}
