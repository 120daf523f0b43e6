package coordinator.clients;

import static coordinator.clients.ScenarioRunner.check;
import static coordinator.clients.ScenarioRunner.describe;
import static coordinator.clients.ScenarioRunner.unique;

import coordinator.clients.ScenarioRunner.Scenario;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionState;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * Kafka's own Java client, unchanged, against one broker: each scenario a method, all of them in
 * one JVM. Usage: Scenarios BOOTSTRAP [SCENARIO...] (none: every one). Each scenario prints one
 * line of JSON, {"scenario": NAME, "ok": BOOL, "detail": TEXT}, and the JVM exits 0 when all ran.
 */
public final class Scenarios {
    private static final Duration DEADLINE = Duration.ofSeconds(45);
    private final String bootstrap;

    private Scenarios(String bootstrap) {
        this.bootstrap = bootstrap;
    }

    public static void main(String[] args) throws Exception {
        Scenarios s = new Scenarios(args[0]);
        Map<String, Scenario> all = new LinkedHashMap<>();
        all.put("admin", s::adminCalls);
        all.put("idempotent_producer", s::idempotentProducer);
        all.put("transactions", s::transactions);
        all.put("exactly_once_loop", s::exactlyOnceLoop);
        all.put("zombie_fencing", s::zombieFencing);
        all.put("timed_out_transaction", s::timedOutTransaction);
        all.put("group_of_two_classic", () -> s.groupOfTwo("classic"));
        all.put("group_of_two_consumer", () -> s.groupOfTwo("consumer"));
        all.put("static_membership", () -> s.staticMembership("classic"));
        all.put("static_membership_consumer", () -> s.staticMembership("consumer"));
        all.put("telemetry", s::telemetry);
        ScenarioRunner.runAll(all, List.of(args).subList(1, args.length), DEADLINE);
    }

    // -- clients ---------------------------------------------------------------------------------

    private Admin admin() {
        return ScenarioRunner.admin(bootstrap, DEADLINE);
    }

    private KafkaProducer<String, String> producer(Map<String, Object> extra) {
        return ScenarioRunner.producer(bootstrap, DEADLINE, extra);
    }

    private KafkaProducer<String, String> transactional(String id) {
        return producer(Map.of(ProducerConfig.TRANSACTIONAL_ID_CONFIG, id));
    }

    private KafkaConsumer<String, String> consumer(Map<String, Object> extra) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        p.putAll(extra);
        return new KafkaConsumer<>(p);
    }

    private void createTopic(Admin admin, String topic, int partitions) throws Exception {
        admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
    }

    /** Every value of the partitions, read from the start to their end offsets in `isolation`. */
    private List<String> readAll(String topic, int partitions, String isolation) {
        List<TopicPartition> tps = new ArrayList<>();
        for (int i = 0; i < partitions; i++) {
            tps.add(new TopicPartition(topic, i));
        }
        try (KafkaConsumer<String, String> c = consumer(Map.of(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation))) {
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> end = c.endOffsets(tps);
            List<String> values = new ArrayList<>();
            long deadline = System.nanoTime() + DEADLINE.toNanos();
            while (tps.stream().anyMatch(tp -> c.position(tp) < end.get(tp))) {
                check(System.nanoTime() < deadline, "read " + values + " of " + topic + ", end " + end);
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                    values.add(r.value());
                }
            }
            return values;
        }
    }

    // -- scenarios -------------------------------------------------------------------------------

    String adminCalls() throws Exception {
        try (Admin admin = admin()) {
            String topic = unique("java-admin");
            admin.createTopics(List.of(new NewTopic(topic, 2, (short) 1).configs(Map.of("retention.ms", "600000")))).all().get();
            TopicDescription described = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
            check(described.partitions().size() == 2, "partitions " + described.partitions());
            ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
            Config config = admin.describeConfigs(List.of(resource)).all().get().get(resource);
            check("600000".equals(config.get("retention.ms").value()), "retention.ms " + config.get("retention.ms"));
            admin.incrementalAlterConfigs(Map.of(resource, List.of(
                new AlterConfigOp(new ConfigEntry("retention.ms", "1200000"), AlterConfigOp.OpType.SET),
                new AlterConfigOp(new ConfigEntry("cleanup.policy", "compact"), AlterConfigOp.OpType.SET)))).all().get();
            config = admin.describeConfigs(List.of(resource)).all().get().get(resource);
            check("1200000".equals(config.get("retention.ms").value()), "altered retention.ms " + config.get("retention.ms"));
            check("compact".equals(config.get("cleanup.policy").value()), "altered cleanup.policy " + config.get("cleanup.policy"));
            admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(4))).all().get();
            described = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
            check(described.partitions().size() == 4, "grown to " + described.partitions().size());
            DescribeClusterResult cluster = admin.describeCluster();
            check(!cluster.nodes().get().isEmpty(), "no nodes");
            check(cluster.clusterId().get() != null, "no cluster id");
            check(cluster.controller().get() != null, "no controller");
            check(admin.listTopics().names().get().contains(topic), "not listed");
            // Tools ask for 3 replicas: kept as the topic's stated factor (DescribeTopicPartitions).
            String three = unique("java-admin-rf3");
            admin.createTopics(List.of(new NewTopic(three, 1, (short) 3))).all().get();
            TopicDescription rf3 = admin.describeTopics(List.of(three)).allTopicNames().get().get(three);
            check(rf3.partitions().get(0).replicas().size() == 3, "replicas " + rf3.partitions().get(0).replicas());
            admin.deleteTopics(List.of(topic, three)).all().get();
            check(!admin.listTopics().names().get().contains(topic), "listed after its deletion");
            return "created, described, altered, grown to 4, a factor of 3 kept, deleted; cluster " + cluster.clusterId().get()
                + " with " + cluster.nodes().get().size() + " node(s)";
        }
    }

    String idempotentProducer() throws Exception {
        String topic = unique("java-idem");
        try (Admin admin = admin()) {
            createTopic(admin, topic, 2);
        }
        List<String> sent = new ArrayList<>();
        try (KafkaProducer<String, String> p = producer(Map.of(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true, ProducerConfig.ACKS_CONFIG, "all"))) {
            for (int i = 0; i < 100; i++) {
                p.send(new ProducerRecord<>(topic, i % 2, "k" + i, "v" + i));
                sent.add("v" + i);
            }
            p.flush();
        }
        List<String> read = readAll(topic, 2, "read_uncommitted");
        check(new HashSet<>(read).equals(new HashSet<>(sent)) && read.size() == sent.size(), "read " + read);
        return "100 records, each once";
    }

    String transactions() throws Exception {
        String topic = unique("java-txn");
        try (Admin admin = admin()) {
            createTopic(admin, topic, 1);
        }
        try (KafkaProducer<String, String> p = transactional(topic)) {
            p.initTransactions();
            String[][] rounds = {{"c0-0", "c0-1", "c0-2"}, {"a-0", "a-1", "a-2"}, {"c1-0", "c1-1"}};
            for (int round = 0; round < rounds.length; round++) {
                p.beginTransaction();
                for (String value : rounds[round]) {
                    p.send(new ProducerRecord<>(topic, 0, null, value));
                }
                if (round == 1) {
                    p.flush(); // an abort drops what the producer has not sent yet
                    p.abortTransaction();
                } else {
                    p.commitTransaction();
                }
            }
        }
        List<String> committed = readAll(topic, 1, "read_committed");
        check(committed.equals(List.of("c0-0", "c0-1", "c0-2", "c1-0", "c1-1")), "read_committed " + committed);
        List<String> everything = readAll(topic, 1, "read_uncommitted");
        check(everything.equals(List.of("c0-0", "c0-1", "c0-2", "a-0", "a-1", "a-2", "c1-0", "c1-1")), "read_uncommitted " + everything);
        try (KafkaConsumer<String, String> c = consumer(Map.of(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed"))) {
            TopicPartition tp = new TopicPartition(topic, 0);
            long end = c.endOffsets(List.of(tp)).get(tp);
            check(end == 11, "the read_committed end offset is " + end + ", not 11 (8 records, 3 markers)");
        }
        // Transaction version 2 (KIP-890): each of the three ends raised the epoch.
        int epoch = describeTransaction(topic).producerEpoch();
        check(epoch == 3, "epoch " + epoch + " after three transactions, not 3 (transaction version 2)");
        return "committed, aborted and committed at epochs 0, 1 and 2: read_committed saw 5 of 8";
    }

    String exactlyOnceLoop() throws Exception {
        String input = unique("java-eos-in");
        String output = unique("java-eos-out");
        String group = unique("java-eos-group");
        int count = 40;
        try (Admin admin = admin()) {
            createTopic(admin, input, 2);
            createTopic(admin, output, 2);
        }
        try (KafkaProducer<String, String> p = producer(Map.of(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true))) {
            for (int i = 0; i < count; i++) {
                p.send(new ProducerRecord<>(input, i % 2, "k" + i, "v" + i));
            }
            p.flush();
        }
        int aborted = 0;
        int done = 0;
        try (KafkaConsumer<String, String> c = consumer(Map.of(
                ConsumerConfig.GROUP_ID_CONFIG, group,
                ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed",
                ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 7));
             KafkaProducer<String, String> p = transactional(output)) {
            p.initTransactions();
            c.subscribe(List.of(input));
            long deadline = System.nanoTime() + DEADLINE.toNanos();
            while (done < count) {
                check(System.nanoTime() < deadline, "transformed " + done + " of " + count);
                ConsumerRecords<String, String> records = c.poll(Duration.ofMillis(200));
                if (records.isEmpty()) {
                    continue;
                }
                p.beginTransaction();
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                for (ConsumerRecord<String, String> r : records) {
                    p.send(new ProducerRecord<>(output, r.partition(), r.key(), r.value().toUpperCase()));
                    offsets.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                }
                p.sendOffsetsToTransaction(offsets, c.groupMetadata());
                if (aborted == 0) {
                    aborted = records.count();
                    p.abortTransaction();
                    // Back to what the group committed: the aborted round's records come again.
                    Set<TopicPartition> assigned = c.assignment();
                    Map<TopicPartition, OffsetAndMetadata> committed = c.committed(assigned);
                    for (TopicPartition tp : assigned) {
                        OffsetAndMetadata at = committed.get(tp);
                        if (at == null) {
                            c.seekToBeginning(List.of(tp));
                        } else {
                            c.seek(tp, at.offset());
                        }
                    }
                    continue;
                }
                p.commitTransaction();
                done += records.count();
            }
        }
        List<String> out = readAll(output, 2, "read_committed");
        List<String> expected = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            expected.add("V" + i);
        }
        check(out.size() == count && new HashSet<>(out).equals(new HashSet<>(expected)), "output " + out);
        try (Admin admin = admin()) {
            Map<TopicPartition, OffsetAndMetadata> offsets = admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
            long sum = offsets.values().stream().mapToLong(OffsetAndMetadata::offset).sum();
            check(offsets.size() == 2 && sum == count, "group offsets " + offsets);
        }
        return count + " records transformed once, " + aborted + " of them in an aborted round first";
    }

    String zombieFencing() throws Exception {
        String topic = unique("java-zombie");
        try (Admin admin = admin()) {
            createTopic(admin, topic, 1);
        }
        KafkaProducer<String, String> zombie = transactional(topic);
        Throwable seen = null;
        try (KafkaProducer<String, String> successor = transactional(topic)) {
            zombie.initTransactions();
            zombie.beginTransaction();
            zombie.send(new ProducerRecord<>(topic, 0, null, "zombie")).get();
            successor.initTransactions();
            // The zombie goes on as KafkaProducer's documentation says a transactional producer
            // should: a KafkaException aborts the transaction; ProducerFencedException ends it.
            try {
                zombie.send(new ProducerRecord<>(topic, 0, null, "zombie-late")).get();
                zombie.commitTransaction();
            } catch (Exception e) {
                seen = e;
                if (!fencedIn(e)) {
                    try {
                        zombie.abortTransaction();
                    } catch (Exception again) {
                        seen = again;
                    }
                }
            }
            successor.beginTransaction();
            successor.send(new ProducerRecord<>(topic, 0, null, "successor"));
            successor.commitTransaction();
        } finally {
            zombie.close(Duration.ZERO);
        }
        check(fencedIn(seen), "the zombie saw " + (seen == null ? "nothing" : describe(seen)));
        List<String> committed = readAll(topic, 1, "read_committed");
        check(committed.equals(List.of("successor")), "read_committed " + committed);
        return "the zombie got " + seen.getClass().getSimpleName() + "; only the successor's record is committed";
    }

    private static boolean fencedIn(Throwable error) {
        for (Throwable t = error; t != null; t = t.getCause()) {
            if (t instanceof ProducerFencedException) {
                return true;
            }
        }
        return false;
    }

    private TransactionDescription describeTransaction(String id) throws Exception {
        try (Admin admin = admin()) {
            return admin.describeTransactions(List.of(id)).all().get().get(id);
        }
    }

    String timedOutTransaction() throws Exception {
        String topic = unique("java-timeout");
        try (Admin admin = admin()) {
            createTopic(admin, topic, 1);
        }
        Throwable seen = null;
        try (KafkaProducer<String, String> p = producer(Map.of(
                ProducerConfig.TRANSACTIONAL_ID_CONFIG, topic,
                ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, 1000))) {
            p.initTransactions();
            p.beginTransaction();
            p.send(new ProducerRecord<>(topic, 0, null, "timed-out")).get();
            long deadline = System.nanoTime() + DEADLINE.toNanos();
            while (describeTransaction(topic).state() != TransactionState.COMPLETE_ABORT) {
                check(System.nanoTime() < deadline, "not aborted: " + describeTransaction(topic).state());
                Thread.sleep(100);
            }
            // The documented loop: a KafkaException aborts the transaction, and the producer goes on.
            try {
                p.send(new ProducerRecord<>(topic, 0, null, "late")).get();
                p.commitTransaction();
            } catch (ProducerFencedException e) {
                throw e;
            } catch (KafkaException | ExecutionException e) {
                seen = e;
                p.abortTransaction();
            }
            p.beginTransaction();
            p.send(new ProducerRecord<>(topic, 0, null, "after"));
            p.commitTransaction();
        }
        check(seen != null, "the producer saw no error after its transaction timed out");
        List<String> committed = readAll(topic, 1, "read_committed");
        check(committed.equals(List.of("after")), "read_committed " + committed);
        return "aborted by its timeout; the producer saw " + seen.getClass().getSimpleName()
            + ", aborted and committed its next transaction";
    }

    String groupOfTwo(String protocol) throws Exception {
        String topic = unique("java-group-" + protocol);
        String group = unique("java-group-" + protocol);
        try (Admin admin = admin()) {
            createTopic(admin, topic, 4);
        }
        Map<String, Object> config = new HashMap<>(Map.of(ConsumerConfig.GROUP_ID_CONFIG, group, ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol));
        if (protocol.equals("classic")) {
            // A classic member learns of a rebalance at its next heartbeat: every 0.5 s, not 3 s.
            // (The consumer protocol's interval is the coordinator's to set, and refused here.)
            config.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, 500);
        }
        try (KafkaConsumer<String, String> first = consumer(config)) {
            KafkaConsumer<String, String> second = consumer(config);
            first.subscribe(List.of(topic));
            second.subscribe(List.of(topic));
            long deadline = System.nanoTime() + DEADLINE.toNanos();
            while (true) {
                check(System.nanoTime() < deadline, "assignments " + first.assignment() + " and " + second.assignment());
                first.poll(Duration.ofMillis(100));
                second.poll(Duration.ofMillis(100));
                Set<TopicPartition> a = first.assignment();
                Set<TopicPartition> b = second.assignment();
                Set<TopicPartition> both = new HashSet<>(a);
                both.addAll(b);
                if (!a.isEmpty() && !b.isEmpty() && both.size() == 4 && a.size() + b.size() == 4) {
                    break;
                }
            }
            String split = first.assignment().size() + "+" + second.assignment().size();
            second.close();
            while (first.assignment().size() != 4) {
                check(System.nanoTime() < deadline, "after the leave: " + first.assignment());
                first.poll(Duration.ofMillis(100));
            }
            try (Admin admin = admin()) {
                ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(group)).all().get().get(group);
                check(d.members().size() == 1, "members " + d.members());
            }
            return protocol + ": split " + split + ", then one took all 4 when the other left";
        }
    }

    String staticMembership(String protocol) throws Exception {
        String topic = unique("java-static");
        String group = unique("java-static");
        try (Admin admin = admin()) {
            createTopic(admin, topic, 2);
        }
        Map<String, Object> config = Map.of(
            ConsumerConfig.GROUP_ID_CONFIG, group,
            ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, "instance-1",
            ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        String firstMember;
        Set<TopicPartition> firstAssignment;
        long deadline = System.nanoTime() + DEADLINE.toNanos();
        try (Admin admin = admin()) {
            try (KafkaConsumer<String, String> c = consumer(config)) {
                c.subscribe(List.of(topic));
                while (c.assignment().size() != 2) {
                    check(System.nanoTime() < deadline, "assignment " + c.assignment());
                    c.poll(Duration.ofMillis(100));
                }
                firstAssignment = c.assignment();
                MemberDescription m = single(admin, group);
                check(m.groupInstanceId().orElse("").equals("instance-1"), "instance id " + m.groupInstanceId());
                firstMember = m.consumerId();
            }
            // A static member's close leaves for now (classic: no LeaveGroup; consumer: epoch -2):
            // the group keeps it until its session ends.
            MemberDescription kept = single(admin, group);
            check(kept.consumerId().equals(firstMember), "after close: " + kept);
            try (KafkaConsumer<String, String> c = consumer(config)) {
                c.subscribe(List.of(topic));
                while (c.assignment().size() != 2) {
                    check(System.nanoTime() < deadline, "assignment after the restart " + c.assignment());
                    c.poll(Duration.ofMillis(100));
                }
                check(c.assignment().equals(firstAssignment), "assignment " + c.assignment());
                MemberDescription m = single(admin, group);
                check(m.groupInstanceId().orElse("").equals("instance-1"), "instance id after the restart " + m.groupInstanceId());
                return protocol + ": instance-1 kept its place through a restart (member " + firstMember + " then " + m.consumerId() + ")";
            }
        }
    }

    private static MemberDescription single(Admin admin, String group) throws Exception {
        Collection<MemberDescription> members = admin.describeConsumerGroups(List.of(group)).all().get().get(group).members();
        check(members.size() == 1, "members " + members.stream().map(MemberDescription::toString).collect(Collectors.joining(", ")));
        return members.iterator().next();
    }

    // -- client telemetry (KIP-714) ---------------------------------------------------------------

    /**
     * A client-metrics subscription set with the Admin client, listed with listConfigResources; a
     * producer it matches is given an instance id, sends 50 records, and pushes its metrics every
     * 100 ms until the coordinator's /metrics (COORDINATOR_METRICS_URL) shows its
     * record.send.total at 50: cumulative, as asked.
     */
    private String telemetry() throws Exception {
        String clientId = unique("telemetry");
        String name = unique("sub");
        String topic = unique("telemetry");
        try (Admin admin = admin()) {
            createTopic(admin, topic, 1);
            ConfigResource subscription = new ConfigResource(ConfigResource.Type.CLIENT_METRICS, name);
            admin.incrementalAlterConfigs(Map.of(subscription, List.of(
                new AlterConfigOp(new ConfigEntry("metrics", "org.apache.kafka.producer.record."), AlterConfigOp.OpType.SET),
                new AlterConfigOp(new ConfigEntry("interval.ms", "100"), AlterConfigOp.OpType.SET),
                new AlterConfigOp(new ConfigEntry("match", "client_id=" + clientId), AlterConfigOp.OpType.SET)
            ))).all().get();
            Collection<ConfigResource> listed = admin.listConfigResources(
                Set.of(ConfigResource.Type.CLIENT_METRICS), new org.apache.kafka.clients.admin.ListConfigResourcesOptions()).all().get();
            check(listed.contains(subscription), "listConfigResources lists the subscription: " + listed);
        }
        try (KafkaProducer<String, String> producer = producer(Map.of(ProducerConfig.CLIENT_ID_CONFIG, clientId))) {
            Uuid instance = producer.clientInstanceId(DEADLINE);
            for (int i = 0; i < 50; i++) {
                producer.send(new ProducerRecord<>(topic, "k", "v" + i));
            }
            producer.flush();
            HttpClient http = HttpClient.newHttpClient();
            HttpRequest scrape = HttpRequest.newBuilder(URI.create(System.getenv("COORDINATOR_METRICS_URL"))).build();
            String wanted = "client_instance_id=\"" + instance + "\"";
            long deadline = System.nanoTime() + DEADLINE.toNanos();
            String last = "";
            while (System.nanoTime() < deadline) {
                for (String line : http.send(scrape, HttpResponse.BodyHandlers.ofString()).body().split("\n")) {
                    if (line.contains(wanted)) {
                        // Only what the subscription asked for.
                        check(line.startsWith("org_apache_kafka_producer_record_"), "not subscribed: " + line);
                    }
                    if (line.startsWith("org_apache_kafka_producer_record_send_total{") && line.contains(wanted)) {
                        last = line;
                    }
                }
                if (last.endsWith(" 50.0")) {
                    return "instance " + instance + ": " + last;
                }
                Thread.sleep(50);  // the next scrape; pushes come every 100 ms
            }
            throw new AssertionError("no push of 50 records sent within the deadline; last: " + last);
        }
    }
}
