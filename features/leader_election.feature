@fake-coderd @leader-election @serial
Feature: Two replicas, one leader
  An operator deployed with more than one replica elects a leader through a Lease (contract
  D-11), and only the leader writes: provisioner keys in coderd (R-HA-1) and objects in
  Kubernetes (R-HA-2). A leader that was paused in the middle of a pass (a frozen node, a long
  garbage collection) and wakes after its Lease passed to another replica must not finish that
  pass: its key requests would replace the key the new leader just made. A leader that is
  stopped releases its Lease before it exits and a standby takes it within 5 s of the release
  (R-HA-3); one that is killed is replaced within the Lease's duration and 5 s (R-HA-4). How
  fast a hand-over is beyond that is a figure, not a bar.

  The suite stops the operator and starts two replicas of it with leader election, as pods run
  them: the first alone, so that the Lease holder identity it takes is known to be its own
  whatever its format (POD_NAME is conformance-replica-a and -b); a stop is SIGTERM to the
  replica's whole process group (a wrapper shell and the operator behind it) and SIGKILL only
  after 10 s. The operator is started again afterwards.

  Background:
    Given a Ready control plane with operator access
    And the operator runs as two leader-elected replicas

  @R-HA-1 @R-HA-2 @R-KEY-4 @extended
  Scenario: A leader paused in the middle of a pass changes nothing when it wakes
    When coderd delays its answers to every GET on "organization" by 2 seconds
    And the sample provisioner is applied
    And the leader is paused as soon as coderd sees its GET on "organization"
    # checks: none
    Then another replica takes over the Lease
    # checks: none
    And the provisioner becomes Ready
    When the paused replica resumes
    # R-HA-1 forbids writes: a deposed replica may still read (list keys) before its fence stops it.
    # checks: R-HA-1, R-KEY-4
    Then coderd sees no provisioner key changes since the last action during the observation window
    # checks: R-HA-1, R-KEY-4
    And coderd saw exactly 1 POST on "provisionerkeys"
    # checks: R-HA-1, R-KEY-4
    And coderd saw no DELETE on "provisionerkey"
    # checks: R-HA-1, R-KEY-4
    And the key in Secret "{provisioner}-provisioner-key" authenticates to coderd as the key named "coderprovisioner-sample"
    # checks: R-HA-1, R-KEY-4
    And the provisioner status records the key in Secret "{provisioner}-provisioner-key"
    # checks: R-HA-2
    And the paused replica gets no Kubernetes write accepted after it resumes, during the observation window

  # R-KEY-22's replacement deletes a key by name: a deposed leader that sent that DELETE after
  # waking would delete the key the new leader has just created under the same name.
  @R-HA-1 @R-HA-2 @R-KEY-4 @R-KEY-22 @extended
  Scenario: A leader paused before replacing a same-named key deletes nothing when it wakes
    Given a provisioner key named "coderprovisioner-sample" already exists in the scenario's organization
    When coderd delays its answers to every POST on "provisionerkeys" by 2 seconds
    And the sample provisioner is applied
    And the leader is paused as soon as coderd sees its POST on "provisionerkeys"
    # checks: none
    Then another replica takes over the Lease
    # checks: R-KEY-22
    And the provisioner becomes Ready
    When the paused replica resumes
    # checks: R-HA-1, R-KEY-4
    Then coderd sees no provisioner key changes since the last action during the observation window
    # checks: R-HA-1, R-KEY-4, R-KEY-22
    And the key in Secret "{provisioner}-provisioner-key" authenticates to coderd as the key named "coderprovisioner-sample"
    # checks: R-HA-2
    And the paused replica gets no Kubernetes write accepted after it resumes, during the observation window

  # The key is created and not yet recorded when the leader freezes: the new leader replaces it
  # (R-KEY-22), and the woken one must not write the key it still holds into the key Secret.
  @R-HA-1 @R-HA-2 @extended
  Scenario: A leader paused between its key create and the key Secret writes nothing when it wakes
    When coderd delays its answers to every GET on "daemon-key" by 2 seconds
    And coderd delays its answers to every GET on "provisionerkeys" by 2 seconds
    And the sample provisioner is applied
    And the leader is paused as soon as coderd sees it look its new key up
    # checks: none
    Then another replica takes over the Lease
    # checks: none
    And the provisioner becomes Ready
    When the paused replica resumes
    # checks: R-HA-1
    Then coderd sees no provisioner key changes since the last action during the observation window
    # checks: R-HA-2
    And the paused replica gets no Kubernetes write accepted after it resumes, during the observation window
    # checks: R-HA-2
    And the key in Secret "{provisioner}-provisioner-key" authenticates to coderd as the key named "coderprovisioner-sample"
    # checks: R-HA-2
    And the provisioner status records the key in Secret "{provisioner}-provisioner-key"

  # A pause between each two of a pass's Kubernetes writes, whatever their order: the API server
  # holds the leader's first write of one kind while the suite freezes it, so it wakes right
  # after that write. Meanwhile the new leader finishes the pass and the CR changes: every write
  # the woken replica still tries rests on a stale read, and none may be accepted (R-HA-2).
  @R-HA-2 @extended
  Scenario Outline: A leader paused right after its first write of <resource> writes nothing when it wakes
    When the API server holds the first write of "<resource>" by a replica for 2 seconds
    And the sample provisioner is applied
    And the leader is paused as soon as the API server holds its write
    # checks: none
    Then another replica takes over the Lease
    # checks: none
    And the provisioner becomes Ready
    When the provisioner spec is changed to:
      """
      {replicas: 2}
      """
    # checks: none
    Then the provisioner Deployment has 2 replicas
    When the paused replica resumes
    Then the paused replica gets no Kubernetes write accepted after it resumes, during the observation window
    And the provisioner Deployment has 2 replicas

    Examples:
      | resource        |
      | secrets         |
      | serviceaccounts |
      | roles           |
      | rolebindings    |
      | deployments     |

  @R-HA-3 @extended
  Scenario: A leader that stops releases its Lease, and a standby takes it
    When the leader is stopped right after it renews its Lease
    Then the stopped leader released its Lease before it exited
    And another replica holds the Lease within 5 seconds of the release
    When the sample provisioner is applied
    # checks: none
    Then the provisioner becomes Ready

  # Whatever coderd's latency: the leader still releases its Lease before it exits (whether it
  # waits for the answer first is its own choice, inside the 10 s before SIGKILL).
  @R-HA-3 @extended
  Scenario: A leader stopped while coderd holds its key request releases its Lease
    When coderd delays its answers to every POST on "provisionerkeys" by 6 seconds
    And the sample provisioner is applied
    And the leader is stopped as soon as coderd sees its POST on "provisionerkeys"
    Then the stopped leader released its Lease before it exited
    And another replica holds the Lease within 5 seconds of the release
    # checks: none
    And the provisioner becomes Ready

  @R-HA-4 @extended
  Scenario: A leader killed without warning is replaced within the Lease's duration
    When the leader is killed right after it renews its Lease
    Then another replica holds the Lease within the Lease's duration and 5 seconds of the kill
    When the sample provisioner is applied
    # checks: none
    Then the provisioner becomes Ready
